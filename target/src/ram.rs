//! The RAM backend: an anonymous private mapping shared by every reactor.
//!
//! Several reactors may touch the same blocks at once (two hosts, or one host's queues on two
//! cores), so the memory is only ever accessed as `AtomicU64` words with relaxed ordering:
//! no Rust reference to plain bytes of it exists, so concurrent access is defined (NVMe leaves
//! the content of overlapping concurrent writes undefined, not the program). Pages are
//! committed on first write; deallocated ranges are handed back with MADV_DONTNEED, which
//! makes them read as zeroes (NVMe DLFEAT "deallocated blocks read as zeroes").

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

const PAGE: u64 = 4096;

/// A RAM disk of `len` bytes (a multiple of 8).
#[derive(Debug)]
pub struct RamDisk {
    base: NonNull<AtomicU64>,
    len: u64,
}

// SAFETY: the mapping is only accessed through AtomicU64 operations (Sync by nature) and
// madvise, which the kernel makes safe against concurrent access; it is unmapped in Drop only.
unsafe impl Send for RamDisk {}
// SAFETY: as above.
unsafe impl Sync for RamDisk {}

impl RamDisk {
    /// Map `len` bytes of zeroed, lazily committed memory.
    pub fn new(len: u64) -> std::io::Result<Self> {
        if len == 0 || !len.is_multiple_of(8) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "RAM size must be a non-zero multiple of 8",
            ));
        }
        // SAFETY: a fresh anonymous private mapping; no existing memory is affected. The
        // result is checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let base = NonNull::new(p.cast::<AtomicU64>()).ok_or_else(std::io::Error::last_os_error)?;
        Ok(Self { base, len })
    }

    /// Size in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Always false: a RAM disk has a size.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn words(&self, off: u64, len: usize) -> &[AtomicU64] {
        assert!(
            off.is_multiple_of(8) && len.is_multiple_of(8) && off + len as u64 <= self.len,
            "RAM access out of bounds"
        );
        // SAFETY: the range is inside the mapping (checked above), 8-aligned (the mapping is
        // page aligned and off is a multiple of 8), and AtomicU64 allows shared access.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add((off / 8) as usize), len / 8) }
    }

    /// Copy `out.len()` bytes at `off` into `out` (both multiples of 8; callers check range).
    pub fn read(&self, off: u64, out: &mut [u8]) {
        for (w, o) in self.words(off, out.len()).iter().zip(out.chunks_exact_mut(8)) {
            o.copy_from_slice(&w.load(Relaxed).to_ne_bytes());
        }
    }

    /// Append `len` bytes at `off` to `out` (no zero-fill of `out` first: a read's data goes
    /// straight from the namespace into the send buffer, one 8-byte store per word).
    pub fn read_append(&self, off: u64, len: usize, out: &mut Vec<u8>) {
        let words = self.words(off, len);
        out.reserve(len);
        let start = out.len();
        for (w, o) in words.iter().zip(out.spare_capacity_mut()[..len].chunks_exact_mut(8)) {
            // SAFETY: `o` is 8 bytes of the vector's spare capacity (reserved above); an
            // unaligned store of one u64 writes exactly those bytes.
            unsafe { std::ptr::write_unaligned(o.as_mut_ptr().cast::<u64>(), w.load(Relaxed)) };
        }
        // SAFETY: the loop initialised all `len` bytes after `start`: words() checked that
        // len is a multiple of 8 and the range is inside the disk, so there are len / 8 words
        // and as many 8-byte chunks.
        unsafe { out.set_len(start + len) };
    }

    /// Copy `data` to `off` (both multiples of 8).
    pub fn write(&self, off: u64, data: &[u8]) {
        for (w, d) in self.words(off, data.len()).iter().zip(data.chunks_exact(8)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(d);
            w.store(u64::from_ne_bytes(b), Relaxed);
        }
    }

    /// Make `len` bytes at `off` read as zeroes, releasing whole pages to the kernel.
    pub fn zero(&self, off: u64, len: u64) {
        let end = off + len;
        let first_page = off.div_ceil(PAGE) * PAGE;
        let last_page = end / PAGE * PAGE;
        if last_page > first_page {
            self.store_zero(off, first_page);
            // SAFETY: [first_page, last_page) is page aligned and inside the mapping;
            // MADV_DONTNEED on a private anonymous mapping only makes pages read as zero.
            let rc = unsafe {
                libc::madvise(
                    self.base.as_ptr().cast::<u8>().add(first_page as usize).cast(),
                    (last_page - first_page) as usize,
                    libc::MADV_DONTNEED,
                )
            };
            if rc != 0 {
                self.store_zero(first_page, last_page);
            }
            self.store_zero(last_page, end);
        } else {
            self.store_zero(off, end);
        }
    }

    fn store_zero(&self, from: u64, to: u64) {
        if to > from {
            for w in self.words(from, (to - from) as usize) {
                w.store(0, Relaxed);
            }
        }
    }
}

impl Drop for RamDisk {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in new(); no reference outlives self.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len as usize) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_read_zero_round_trip() {
        let d = RamDisk::new(64 * 1024).unwrap_or_else(|e| panic!("{e}"));
        let data: Vec<u8> = (0..12_288u32).map(|i| (i * 7 + 3) as u8).collect();
        d.write(4096 - 512, &data);
        let mut back = vec![0u8; data.len()];
        d.read(4096 - 512, &mut back);
        assert_eq!(back, data);
        // zero a range that covers a whole page and two partial ones
        d.zero(4096 - 256, 8192 + 512);
        d.read(4096 - 512, &mut back);
        assert_eq!(&back[..256], &data[..256]);
        assert!(back[256..256 + 8192 + 512].iter().all(|&b| b == 0));
        assert_eq!(&back[256 + 8192 + 512..], &data[256 + 8192 + 512..]);
    }

    #[test]
    fn read_append_appends_exactly_the_bytes() {
        let d = RamDisk::new(8192).unwrap_or_else(|e| panic!("{e}"));
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 31 + 7) as u8).collect();
        d.write(4096, &data);
        let mut out = b"header".to_vec();
        d.read_append(4096, 4096, &mut out);
        assert_eq!(&out[..6], b"header");
        assert_eq!(&out[6..], &data[..]);
    }

    #[test]
    fn fresh_memory_reads_as_zero() {
        let d = RamDisk::new(1 << 30).unwrap_or_else(|e| panic!("{e}"));
        let mut b = vec![1u8; 4096];
        d.read((1 << 30) - 4096, &mut b);
        assert!(b.iter().all(|&x| x == 0));
    }
}
