//! A command's host-to-controller data while it arrives: the buffer it goes into (heap memory
//! from the reactor's pool, or a DMA buffer of the SSD the write goes to), how much of it came,
//! and the per-reactor pool of buffers. The transport the queue asks for the data
//! ([`super::Transport::fetch_data`]) puts it here.

use pollux_nvme::tcp::{Crc32c, crc32c};

use crate::backend::PooledDma;
use crate::pool::{Pool, Pooled, Shelf};

/// The buffer a command's data is received into. Either kind goes back to the pool it came
/// from when dropped ([`crate::pool`]).
#[derive(Debug)]
pub enum DataBuf {
    /// Heap memory (from the reactor's [`DataPool`]).
    Heap(HeapBuf),
    /// A DMA buffer of the SSD channel the write goes to: the data is copied once, from the
    /// socket into DMA memory.
    Dma(PooledDma),
}

impl DataBuf {
    /// Copy `data` to offset `at` (callers checked the range against the length fetched).
    pub fn place(&mut self, at: u32, data: &[u8]) {
        let at = at as usize;
        match self {
            // Volatile stores: the device reads this memory.
            DataBuf::Dma(d) => d.region().write_bytes(d.offset() + at, data),
            DataBuf::Heap(b) => b[at..at + data.len()].copy_from_slice(data),
        }
    }

    /// `[at, at + len)` as raw memory, for the kernel to write into (readv). No Rust
    /// reference to DMA memory is made.
    pub fn dest_ptr(&mut self, at: u32, len: usize) -> *mut u8 {
        let at = at as usize;
        match self {
            DataBuf::Dma(d) => {
                assert!(at + len <= d.len(), "in-place data past its DMA buffer");
                d.region().as_ptr().wrapping_add(d.offset() + at)
            }
            DataBuf::Heap(b) => b[at..at + len].as_mut_ptr(),
        }
    }

    /// CRC32C of `[at, at + len)`: a transport's digest of data it received in place. DMA memory is
    /// read with volatile copies, a page at a time.
    pub fn crc(&self, at: u32, len: u32) -> u32 {
        let (at, len) = (at as usize, len as usize);
        match self {
            DataBuf::Dma(d) => {
                let mut crc = Crc32c::new();
                let mut chunk = [0u8; 4096];
                let mut done = 0;
                while done < len {
                    let n = (len - done).min(chunk.len());
                    d.region().read_bytes(d.offset() + at + done, &mut chunk[..n]);
                    crc.update(&chunk[..n]);
                    done += n;
                }
                crc.finish()
            }
            DataBuf::Heap(b) => crc32c(&b[at..at + len]),
        }
    }
}

/// Where the data fetched for a command stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataProgress {
    /// Bytes asked for.
    pub len: u32,
    /// Bytes received so far.
    pub received: u32,
}

impl DataProgress {
    /// All the data is in.
    pub fn complete(&self) -> bool {
        self.received == self.len
    }
}

/// Data buffers a reactor keeps for its connections to reuse, shared by them (reactor-local
/// state: no lock). A write whose data is fetched needs a buffer of its length until its data
/// has arrived and it ran, and allocating and zero-filling a new one per write is costly: 128
/// KiB sequential writes at QD32 had 24 of their 32 buffers new each round under the old pool
/// of 8 per connection; with this one, IOPS x1.055 and target CPU per I/O x0.950 (10
/// alternating pairs; the client is then the limit). The pool is bounded in bytes per
/// reactor, however many connections it serves, as SPDK bounds its transport's shared data
/// buffers (511 of 128 KiB by default); what it does not keep is freed. Its buffers
/// ([`HeapBuf`]) come back by themselves when dropped.
pub type DataPool = Pool<DataShelf>;

/// A data buffer lent by a [`DataPool`].
pub type HeapBuf = Pooled<DataShelf>;

/// What a [`DataPool`] keeps: data buffers, at most [`DataShelf::MAX_BYTES`] of capacity.
#[derive(Debug, Default)]
pub struct DataShelf {
    bufs: Vec<Vec<u8>>,
    /// Capacity of the buffers kept.
    bytes: usize,
}

impl DataShelf {
    /// Most bytes of buffers kept per reactor: QD32 of 128 KiB writes on eight connections.
    pub const MAX_BYTES: usize = 32 << 20;

    /// A kept buffer (or a new, empty one), no longer counted.
    fn pop(&mut self) -> Vec<u8> {
        let buf = self.bufs.pop().unwrap_or_default();
        self.bytes -= buf.capacity().min(self.bytes);
        buf
    }

    /// Bytes (capacity) of the buffers kept.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Shelf for DataShelf {
    type Item = Vec<u8>;

    /// Keep `buf` for reuse, or free it when the pool is full.
    fn keep(&mut self, buf: Vec<u8>) {
        let cap = buf.capacity();
        if cap > 0 && self.bytes + cap <= Self::MAX_BYTES {
            self.bytes += cap;
            self.bufs.push(buf);
        }
    }
}

/// A buffer of `len` bytes from `pool` (a function, not a method of the pool: [`Pool`] is the
/// store's type). A kept one keeps its length, so only growth is zeroed: the transport puts
/// every byte up to `len` once, in order from offset 0, before the command uses the buffer
/// ([`super::Transport::fetch_data`]).
pub fn take(pool: &DataPool, len: usize) -> HeapBuf {
    let mut buf = pool.with(DataShelf::pop).unwrap_or_default();
    buf.resize(len, 0);
    pool.lend(buf)
}

#[cfg(test)]
mod tests {
    use super::{DataPool, DataShelf, take};

    fn kept(pool: &DataPool) -> (usize, usize) {
        pool.with(|s| (s.bufs.len(), s.bytes)).unwrap_or_default()
    }

    #[test]
    fn data_buffers_are_reused_up_to_the_pool_bound() {
        let pool = DataPool::default();
        let a = take(&pool, 128 << 10);
        assert_eq!(a.len(), 128 << 10);
        let ptr = a.as_ptr();
        // Dropped: back in the pool, no hand-written return.
        drop(a);
        assert_eq!(kept(&pool), (1, 128 << 10));
        // The same buffer comes back, keeping its length (only growth is zeroed).
        let b = take(&pool, 64 << 10);
        assert_eq!((b.as_ptr(), b.len()), (ptr, 64 << 10));
        assert_eq!(kept(&pool), (0, 0));
        drop(b);
        // Beyond the bound, buffers are freed, not kept.
        let n = DataShelf::MAX_BYTES / (128 << 10);
        let bufs: Vec<_> = (0..n + 4).map(|_| take(&pool, 128 << 10)).collect();
        drop(bufs);
        let (count, bytes) = kept(&pool);
        assert_eq!(count, n);
        assert!(bytes <= DataShelf::MAX_BYTES);
        let sum = pool.with(|s| s.bufs.iter().map(Vec::capacity).sum::<usize>());
        assert_eq!(Some(bytes), sum);
    }

    #[test]
    fn a_data_buffer_outliving_its_pool_is_freed() {
        let pool = DataPool::default();
        let a = take(&pool, 4096);
        drop(pool);
        assert_eq!(a.len(), 4096);
        drop(a);
    }
}
