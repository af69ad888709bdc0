//! The receive buffer over a socketpair: reads and their outcomes (data, empty, full, end of
//! stream), compaction and growth, and data received in place.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::os::unix::net::UnixStream;

use pollux_nvme::tcp::{Recv, RxBuf};

/// A connected pair: the receiver's end non-blocking, as both receivers use theirs.
fn pair() -> (UnixStream, UnixStream) {
    let (rx, tx) = UnixStream::pair().unwrap();
    rx.set_nonblocking(true).unwrap();
    (rx, tx)
}

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}

#[test]
fn recv_reads_what_is_there_and_tells_when_the_socket_is_empty() {
    let (sock, mut peer) = pair();
    let mut rx = RxBuf::new(64);
    assert_eq!(rx.recv(&sock).unwrap(), Recv::Empty);
    peer.write_all(b"hello").unwrap();
    // A short read: the socket is drained.
    assert_eq!(
        rx.recv(&sock).unwrap(),
        Recv::Data {
            buffered: 5,
            placed: 0,
            drained: true
        }
    );
    assert_eq!(rx.avail(), b"hello");
    // Exactly the room: not known to be drained.
    peer.write_all(&[7; 59]).unwrap();
    assert_eq!(
        rx.recv(&sock).unwrap(),
        Recv::Data {
            buffered: 59,
            placed: 0,
            drained: false
        }
    );
    assert_eq!((rx.len(), rx.room()), (64, 0));
    peer.write_all(b"more").unwrap();
    assert_eq!(rx.recv(&sock).unwrap(), Recv::Full);
    rx.consume(60);
    assert_eq!(rx.avail(), &[7; 4]);
    // Consuming more than there is empties the buffer.
    rx.consume(1000);
    assert!(rx.is_empty());
    rx.make_room(0);
    assert_eq!(rx.room(), 64);
    assert_eq!(
        rx.recv(&sock).unwrap(),
        Recv::Data {
            buffered: 4,
            placed: 0,
            drained: true
        }
    );
    assert_eq!(rx.avail(), b"more");
}

#[test]
fn the_end_of_the_stream_comes_after_the_last_bytes() {
    let (sock, mut peer) = pair();
    let mut rx = RxBuf::new(64);
    peer.write_all(b"last").unwrap();
    drop(peer);
    assert!(matches!(rx.recv(&sock).unwrap(), Recv::Data { buffered: 4, .. }));
    assert_eq!(rx.recv(&sock).unwrap(), Recv::Eof);
    assert_eq!(rx.avail(), b"last");
    assert_eq!(rx.recv(&sock).unwrap(), Recv::Eof);
}

#[test]
fn make_room_starts_over_when_empty_and_compacts_when_more_than_half_is_used() {
    let (sock, mut peer) = pair();
    let mut rx = RxBuf::new(100);
    let data = bytes(100, 1);
    peer.write_all(&data[..40]).unwrap();
    rx.recv(&sock).unwrap();
    rx.consume(30);
    // 40 of 100 used, and 30 bytes at the front fit where they are: nothing moves.
    rx.make_room(30);
    assert_eq!((rx.avail(), rx.room()), (&data[30..40], 60));
    // ... unless they would not fit.
    rx.make_room(80);
    assert_eq!((rx.avail(), rx.room()), (&data[30..40], 90));
    peer.write_all(&data[40..100]).unwrap();
    rx.recv(&sock).unwrap();
    assert_eq!(rx.avail(), &data[30..100]);
    rx.consume(10);
    // 70 of 100 used: the unread bytes move to the front.
    rx.make_room(0);
    assert_eq!((rx.avail(), rx.room()), (&data[40..100], 40));
    rx.consume(60);
    assert_eq!(rx.room(), 40);
    rx.make_room(0);
    assert_eq!(rx.room(), 100);
}

#[test]
fn make_room_grows_the_buffer_for_a_pdu_larger_than_it() {
    let (sock, mut peer) = pair();
    let mut rx = RxBuf::new(32);
    let data = bytes(300, 2);
    peer.write_all(&data).unwrap();
    rx.recv(&sock).unwrap();
    rx.consume(8);
    rx.make_room(300);
    assert_eq!(rx.capacity(), 300);
    assert_eq!(rx.avail(), &data[8..32]);
    while rx.len() < 292 {
        assert!(matches!(rx.recv(&sock).unwrap(), Recv::Data { .. }));
    }
    assert_eq!(rx.avail(), &data[8..]);
}

/// The target's in-place H2CData: the rest of a PDU's data straight into its destination,
/// what follows into the buffer.
#[test]
fn recv_into_puts_the_data_in_place_and_what_follows_in_the_buffer() {
    let (sock, mut peer) = pair();
    let mut rx = RxBuf::new(64);
    let mut dest = vec![0u8; 100];
    let data = bytes(100, 3);
    peer.write_all(&data).unwrap();
    peer.write_all(b"next PDU").unwrap();
    // SAFETY: `dest` is a live Vec of 100 bytes that nothing else uses during the call.
    let r = unsafe { rx.recv_into(&sock, 0, dest.as_mut_ptr(), 100, 16) }.unwrap();
    assert_eq!(
        r,
        Recv::Data {
            buffered: 8,
            placed: 100,
            drained: true
        }
    );
    assert_eq!(dest, data);
    assert_eq!(rx.avail(), b"next PDU");

    // Less than the data: part of it placed, nothing buffered, and the rest next time.
    let mut dest = vec![0u8; 100];
    let data = bytes(100, 4);
    peer.write_all(&data[..30]).unwrap();
    rx.clear();
    // SAFETY: as above.
    let r = unsafe { rx.recv_into(&sock, 0, dest.as_mut_ptr(), 100, 16) }.unwrap();
    assert_eq!(
        r,
        Recv::Data {
            buffered: 0,
            placed: 30,
            drained: true
        }
    );
    assert!(rx.is_empty());
    peer.write_all(&data[30..]).unwrap();
    // SAFETY: as above, 70 bytes from offset 30.
    let r = unsafe { rx.recv_into(&sock, 0, dest[30..].as_mut_ptr(), 70, 16) }.unwrap();
    assert!(matches!(
        r,
        Recv::Data {
            buffered: 0,
            placed: 70,
            ..
        }
    ));
    assert_eq!(dest, data);
    // SAFETY: as above.
    let r = unsafe { rx.recv_into(&sock, 0, dest.as_mut_ptr(), 100, 16) }.unwrap();
    assert_eq!(r, Recv::Empty);
    drop(peer);
    // SAFETY: as above.
    let r = unsafe { rx.recv_into(&sock, 0, dest.as_mut_ptr(), 100, 16) }.unwrap();
    assert_eq!(r, Recv::Eof);
}

/// The host's in-place read: a header into the buffer, the data in place, then what follows
/// after the header; put back in stream order when it was not the PDU expected.
#[test]
fn recv_into_with_a_head_and_putting_the_data_back_in_order() {
    let (sock, mut peer) = pair();
    let mut rx = RxBuf::new(200);
    let stream = bytes(170, 5);
    peer.write_all(&stream).unwrap();
    let mut dest = vec![0u8; 100];
    // SAFETY: `dest` is a live Vec of 100 bytes that nothing else uses during the call.
    let r = unsafe { rx.recv_into(&sock, 24, dest.as_mut_ptr(), 100, 200 - 24 - 100) }.unwrap();
    assert_eq!(
        r,
        Recv::Data {
            buffered: 70,
            placed: 100,
            drained: true
        }
    );
    assert_eq!(&dest[..], &stream[24..124]);
    assert_eq!(&rx.avail()[..24], &stream[..24]);
    assert_eq!(&rx.avail()[24..], &stream[124..]);
    rx.insert(24, &dest);
    assert_eq!(rx.avail(), &stream[..]);

    // Only part of the head: nothing placed.
    rx.clear();
    peer.write_all(&stream[..10]).unwrap();
    // SAFETY: as above.
    let r = unsafe { rx.recv_into(&sock, 24, dest.as_mut_ptr(), 100, 76) }.unwrap();
    assert!(matches!(
        r,
        Recv::Data {
            buffered: 10,
            placed: 0,
            ..
        }
    ));
    assert_eq!(rx.avail(), &stream[..10]);

    // No room: the head and tail are cut to none, the data still goes in place.
    let mut full = RxBuf::new(8);
    peer.write_all(&stream[..50]).unwrap();
    while full.room() > 0 {
        full.recv(&sock).unwrap();
    }
    // SAFETY: as above.
    let r = unsafe { full.recv_into(&sock, 24, dest.as_mut_ptr(), 42, 10) }.unwrap();
    assert!(matches!(
        r,
        Recv::Data {
            buffered: 0,
            placed: 42,
            ..
        }
    ));
    assert_eq!(&dest[..42], &stream[8..50]);
}

#[test]
fn insert_makes_room_when_there_is_none() {
    let mut rx = RxBuf::new(8);
    let (sock, mut peer) = pair();
    peer.write_all(b"abcdefgh").unwrap();
    rx.recv(&sock).unwrap();
    rx.consume(2);
    // Compacts first.
    rx.insert(2, b"XY");
    assert_eq!(rx.avail(), b"cdXYefgh");
    assert_eq!(rx.capacity(), 8);
    // Grows.
    rx.insert(100, b"12");
    assert_eq!(rx.avail(), b"cdXYefgh12");
    assert!(rx.capacity() >= 10);
}
