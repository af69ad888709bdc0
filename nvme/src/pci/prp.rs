//! Physical Region Page entries and lists (NVMe 2.0 §4.1.1, Figures 84-86).
//!
//! With a memory page size of 4 KiB (CC.MPS = 0):
//! - PRP1 points at the first byte; it may have an offset into its page (dword aligned).
//! - A transfer that ends in the first page: PRP2 = 0.
//! - One that ends in the second page: PRP2 is that page's address (offset 0).
//! - Longer: PRP2 is the address of a PRP list: one entry per further page, each with
//!   offset 0. A list page holds 512 entries; when more are needed, its last entry points
//!   to the next list page (a chain).

use super::dma::{DmaRegion, PAGE_SIZE};

/// Entries in one PRP list page (4096 / 8).
pub const ENTRIES_PER_LIST_PAGE: usize = PAGE_SIZE / 8;

/// Pages a transfer of `len` bytes at `iova` touches: the number of PRP entries it needs.
pub const fn pages_spanned(iova: u64, len: usize) -> usize {
    if len == 0 {
        return 0;
    }
    let first = (iova as usize) & (PAGE_SIZE - 1);
    (first + len).div_ceil(PAGE_SIZE)
}

/// PRP list pages needed for a transfer touching `pages` pages (entries after PRP1 go into
/// lists only when there are more than two pages).
pub const fn list_pages_needed(pages: usize) -> usize {
    if pages <= 2 {
        return 0;
    }
    let m = pages - 1; // entries in lists
    if m <= ENTRIES_PER_LIST_PAGE {
        1
    } else {
        // Every page but the last gives up its last entry to the chain pointer.
        1 + (m - ENTRIES_PER_LIST_PAGE).div_ceil(ENTRIES_PER_LIST_PAGE - 1)
    }
}

/// Why PRPs could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PrpError {
    /// PRP1 must be dword aligned (NVMe 2.0 §4.1.1: bits 1:0 are 0).
    #[error("buffer IOVA {0:#x} is not dword aligned")]
    Misaligned(u64),
    /// More list pages needed than the command has.
    #[error("transfer needs {needed} PRP list pages, the command has {have}")]
    ListTooSmall {
        /// Needed.
        needed: usize,
        /// Available.
        have: usize,
    },
}

/// The PRP list pages a command may use: `pages` consecutive pages of `region` from `offset`.
#[derive(Clone, Copy, Debug)]
pub struct ListPages<'a> {
    /// The pool region.
    pub region: &'a DmaRegion,
    /// Byte offset of the first page (page aligned).
    pub offset: usize,
    /// How many pages.
    pub pages: usize,
}

/// Builds PRP1 and PRP2 for `len` bytes at `iova` (contiguous in IOVA space), writing a PRP
/// list into `lists` when the transfer touches more than two pages.
pub fn build(iova: u64, len: usize, lists: ListPages<'_>) -> Result<(u64, u64), PrpError> {
    if iova & 3 != 0 {
        return Err(PrpError::Misaligned(iova));
    }
    let pages = pages_spanned(iova, len);
    let page_mask = PAGE_SIZE as u64 - 1;
    let first_page = iova & !page_mask;
    match pages {
        0 | 1 => return Ok((iova, 0)),
        2 => return Ok((iova, first_page + PAGE_SIZE as u64)),
        _ => {}
    }
    let needed = list_pages_needed(pages);
    if needed > lists.pages {
        return Err(PrpError::ListTooSmall {
            needed,
            have: lists.pages,
        });
    }
    // Entries for pages 1..pages, in list pages chained through their last slot.
    let list_iova = |k: usize| lists.region.iova() + (lists.offset + k * PAGE_SIZE) as u64;
    let mut list = 0usize;
    let mut slot = 0usize;
    for p in 1..pages {
        let remaining = pages - p; // entries still to write, this one included
        if slot == ENTRIES_PER_LIST_PAGE - 1 && remaining > 1 {
            // Last slot and more than one entry left: chain to the next list page.
            let off = lists.offset + list * PAGE_SIZE + slot * 8;
            lists.region.write_u64(off, list_iova(list + 1));
            list += 1;
            slot = 0;
        }
        let off = lists.offset + list * PAGE_SIZE + slot * 8;
        lists.region.write_u64(off, first_page + (p * PAGE_SIZE) as u64);
        slot += 1;
    }
    Ok((iova, list_iova(0)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::pci::dma::HostMemory;

    #[test]
    fn counts() {
        assert_eq!(pages_spanned(0x1000, 4096), 1);
        assert_eq!(pages_spanned(0x1200, 4096), 2);
        assert_eq!(pages_spanned(0x1FFC, 8), 2);
        assert_eq!(pages_spanned(0x1000, 0), 0);
        assert_eq!(list_pages_needed(2), 0);
        assert_eq!(list_pages_needed(3), 1);
        assert_eq!(list_pages_needed(513), 1);
        assert_eq!(list_pages_needed(514), 2);
        assert_eq!(list_pages_needed(1 + 511 + 512), 2);
        assert_eq!(list_pages_needed(1 + 511 + 512 + 1), 3);
    }

    #[test]
    fn chained_list() {
        let r = DmaRegion::new(HostMemory::new(3 * PAGE_SIZE).unwrap(), 0x9000_0000, None);
        let lists = ListPages {
            region: &r,
            offset: 0,
            pages: 3,
        };
        let base = 0x4000_0000u64;
        let pages = 600;
        let (p1, p2) = build(base + 8, (pages - 1) * PAGE_SIZE, lists).unwrap();
        assert_eq!((p1, p2), (base + 8, 0x9000_0000));
        // Page 0 holds pages 1..=511, then the chain pointer.
        assert_eq!(r.read_u64(0), base + 0x1000);
        assert_eq!(r.read_u64(510 * 8), base + 511 * 0x1000);
        assert_eq!(r.read_u64(511 * 8), 0x9000_1000);
        assert_eq!(r.read_u64(PAGE_SIZE), base + 512 * 0x1000);
        assert_eq!(r.read_u64(PAGE_SIZE + 87 * 8), base + 599 * 0x1000);
        assert_eq!(
            build(
                base,
                600 * PAGE_SIZE,
                ListPages {
                    region: &r,
                    offset: 0,
                    pages: 1
                }
            ),
            Err(PrpError::ListTooSmall { needed: 2, have: 1 })
        );
        assert_eq!(build(base + 2, 8, lists), Err(PrpError::Misaligned(base + 2)));
    }
}
