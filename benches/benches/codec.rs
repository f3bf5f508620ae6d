//! Codec and transport bench: framing a read buffer, and reading a socket into it.
//!
//! Groups:
//!
//! - `line_decoder`: `ringrpc::LineDecoder::decode`.
//!   - `split_64k`: split a 64 KiB `BytesMut` holding 1,057 newline-delimited copies of
//!     the 61-byte subtract call (`benches::inputs::SUBTRACT`) into frames, dropping each
//!     frame as a connection would once it is answered. The buffer is cloned from a
//!     template outside the timed section (`iter_batched_ref`), so only the decoding is
//!     measured. Throughput in bytes.
//!   - `byte_at_a_time/{1024,16384}`: feed one request line of 1 KiB or 16 KiB into the
//!     buffer one byte at a time, calling `decode` after every byte (it returns `None`
//!     until the final `\n`). The decoder remembers how far it has searched, so the total
//!     is O(n): the time per byte (throughput in bytes) should be the same for both
//!     lengths. A scan that restarted from the front would make the 16 KiB line 16×
//!     slower per byte.
//! - `socket_read`: the cost the one `unsafe` read in `engine/src/transport/io.rs` saves.
//!   That module is crate-private, so both variants are reproduced here:
//!   - `spare_capacity`: [`read_into`], a copy of the engine's function — read(2) straight
//!     into `BytesMut::spare_capacity_mut()`, then `set_len`;
//!   - `zeroed_resize`: the safe way — `buf.resize(len + 64 KiB, 0)`, `std::io::Read::read`
//!     into the zeroed tail, then `truncate`.
//!
//!   A `UnixStream` pair carries a 100-byte message (a small request) or a 16 KiB one.
//!   Each iteration writes the message (not timed), then times the one read that takes
//!   it, so both variants read the very same bytes; the read buffer is cleared and reused
//!   between iterations as a connection's is. Throughput in bytes; the time is per read.
//!
//! ```text
//! cargo bench -p benches --bench codec -- --warm-up-time 1 --measurement-time 3
//! ```

use std::hint::black_box;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use benches::inputs;
use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use ringrpc::LineDecoder;

/// The engine's read buffer reserves this much free space before every read.
const READ_CHUNK: usize = 64 * 1024;

/// A frame limit that no bench input reaches.
const MAX_FRAME: usize = 1 << 20;

/// `split_64k`'s input: as many newline-terminated subtract calls as fit in 64 KiB.
fn subtract_lines() -> (BytesMut, usize) {
    let line = [inputs::SUBTRACT.as_bytes(), b"\n"].concat();
    let count = (64 * 1024) / line.len();
    let mut buf = BytesMut::with_capacity(64 * 1024);
    for _ in 0..count {
        buf.extend_from_slice(&line);
    }
    (buf, count)
}

/// One `echo` request line of exactly `len` bytes, `\n` included.
fn echo_line(len: usize) -> Vec<u8> {
    let head = br#"{"jsonrpc":"2.0","method":"echo","params":[""#;
    let tail = b"\"],\"id\":1}\n";
    let pad = len - head.len() - tail.len();
    let mut line = Vec::with_capacity(len);
    line.extend_from_slice(head);
    line.resize(head.len() + pad, b'x');
    line.extend_from_slice(tail);
    assert_eq!(line.len(), len);
    line
}

/// Decodes every frame in `buf`, dropping each; returns how many there were.
fn decode_all(dec: &mut LineDecoder, buf: &mut BytesMut) -> usize {
    let mut frames = 0;
    while let Some(frame) = dec.decode(buf).expect("frame within the limit") {
        black_box(&frame);
        frames += 1;
    }
    frames
}

/// Feeds `line` into `buf` one byte at a time, decoding after each; returns the frame.
fn feed_bytewise(dec: &mut LineDecoder, buf: &mut BytesMut, line: &[u8]) -> Option<BytesMut> {
    for &byte in line {
        buf.extend_from_slice(&[byte]);
        if let Some(frame) = dec.decode(buf).expect("frame within the limit") {
            return Some(frame);
        }
    }
    None
}

fn line_decoder(c: &mut Criterion) {
    let mut group = c.benchmark_group("line_decoder");

    let (template, count) = subtract_lines();
    assert_eq!(
        decode_all(&mut LineDecoder::new(MAX_FRAME), &mut template.clone()),
        count
    );
    group.throughput(Throughput::Bytes(template.len() as u64));
    group.bench_function("split_64k", |b| {
        let mut dec = LineDecoder::new(MAX_FRAME);
        b.iter_batched_ref(
            || template.clone(),
            |buf| black_box(decode_all(&mut dec, buf)),
            BatchSize::SmallInput,
        );
    });

    for len in [1024, 16 * 1024] {
        let line = echo_line(len);
        let frame = feed_bytewise(
            &mut LineDecoder::new(MAX_FRAME),
            &mut BytesMut::new(),
            &line,
        )
        .expect("one frame");
        assert_eq!(&frame[..], &line[..len - 1]);

        group.throughput(Throughput::Bytes(len as u64));
        group.bench_with_input(BenchmarkId::new("byte_at_a_time", len), &line, |b, line| {
            let mut dec = LineDecoder::new(MAX_FRAME);
            let mut buf = BytesMut::with_capacity(len);
            b.iter(|| {
                buf.clear();
                let frame = feed_bytewise(&mut dec, &mut buf, black_box(line));
                black_box(frame)
            });
        });
    }
    group.finish();
}

/// **A copy of the engine's `read_into` (`engine/src/transport/io.rs`)**, which is
/// crate-private; keep the two in step.
///
/// Reads once from `fd` into the spare capacity of `buf` (reserving `min_free` bytes
/// first) and returns how many bytes arrived; `Ok(0)` is end of stream.
fn read_into(fd: RawFd, buf: &mut BytesMut, min_free: usize) -> io::Result<usize> {
    buf.reserve(min_free);
    let spare = buf.spare_capacity_mut();
    // SAFETY: `spare` is writable memory owned by `buf`, `spare.len()` bytes long, and
    // read(2) writes at most that many bytes into it.
    let n = unsafe { libc::read(fd, spare.as_mut_ptr().cast(), spare.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = n as usize;
    // SAFETY: read(2) initialized the first `n` bytes of the spare capacity, which
    // directly follow the buffer's current contents.
    unsafe { buf.set_len(buf.len() + n) };
    Ok(n)
}

/// The safe alternative: zero `min_free` bytes past the contents, read into them, and
/// cut the buffer back to what arrived.
fn read_zeroed(sock: &mut UnixStream, buf: &mut BytesMut, min_free: usize) -> io::Result<usize> {
    let len = buf.len();
    buf.resize(len + min_free, 0);
    let read = sock.read(&mut buf[len..]);
    buf.truncate(len + *read.as_ref().unwrap_or(&0));
    read
}

/// A read variant under test: one read from the socket into the buffer.
type ReadFn = fn(&mut UnixStream, &mut BytesMut) -> io::Result<usize>;

fn socket_read(c: &mut Criterion) {
    let variants: [(&str, ReadFn); 2] = [
        ("spare_capacity", |sock, buf| {
            read_into(sock.as_raw_fd(), buf, READ_CHUNK)
        }),
        ("zeroed_resize", |sock, buf| {
            read_zeroed(sock, buf, READ_CHUNK)
        }),
    ];

    let mut group = c.benchmark_group("socket_read");
    for size in [100usize, 16 * 1024] {
        let message: Vec<u8> = (0..size).map(|i| b'a' + (i % 26) as u8).collect();
        group.throughput(Throughput::Bytes(size as u64));
        for (name, read) in variants {
            let (mut writer, mut reader) = UnixStream::pair().expect("socket pair");
            // As the engine's sockets are; the message is always there before the read.
            reader.set_nonblocking(true).expect("non-blocking");
            let mut buf = BytesMut::with_capacity(READ_CHUNK);

            // Both variants read the whole message in one read, byte for byte.
            writer.write_all(&message).expect("write");
            assert_eq!(read(&mut reader, &mut buf).expect("read"), size);
            assert_eq!(&buf[..], &message[..]);
            buf.clear();

            group.bench_function(BenchmarkId::new(name, size), |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        writer.write_all(&message).expect("write");
                        let start = Instant::now();
                        let n = read(&mut reader, black_box(&mut buf));
                        total += start.elapsed();
                        assert_eq!(n.expect("read"), size);
                        buf.clear();
                    }
                    total
                });
            });
        }
    }
    group.finish();
}

criterion_group!(codec, line_decoder, socket_read);
criterion_main!(codec);
