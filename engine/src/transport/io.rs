//! Reading from a socket straight into a read buffer's spare capacity.

use std::io;
use std::os::fd::RawFd;

use bytes::BytesMut;

/// Reads once from `fd` into the spare capacity of `buf` (reserving `min_free` bytes
/// first, and reading at most `min_free`, so one read cannot take in much more than the
/// caller's limits were checked for) and returns how many bytes arrived; `Ok(0)` is end
/// of stream.
///
/// `std::io::Read` needs an initialized slice, which would mean zeroing the buffer's
/// free space (up to 64 KiB) before every read — more than the rest of a small
/// request's whole path. read(2) can write into uninitialized memory, so it is called
/// directly.
pub(crate) fn read_into(fd: RawFd, buf: &mut BytesMut, min_free: usize) -> io::Result<usize> {
    buf.reserve(min_free);
    let spare = buf.spare_capacity_mut();
    let n = min_free.min(spare.len());
    let spare = &mut spare[..n];
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

/// The credentials of the process at the other end of a Unix socket (`SO_PEERCRED`, as
/// they were at connect time): (pid, uid, gid).
pub(crate) fn peer_cred(fd: RawFd) -> io::Result<(i32, u32, u32)> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a writable `ucred` and `len` its size; getsockopt(2) writes at
    // most `len` bytes into it and the new length into `len`.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::from_mut(&mut cred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((cred.pid, cred.uid, cred.gid))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn reads_append_to_the_buffer() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let mut buf = BytesMut::from(&b"head:"[..]);
        a.write_all(b"hello").unwrap();
        assert_eq!(read_into(b.as_raw_fd(), &mut buf, 16).unwrap(), 5);
        assert_eq!(&buf[..], b"head:hello");
        a.write_all(&[7u8; 100]).unwrap();
        assert_eq!(read_into(b.as_raw_fd(), &mut buf, 128).unwrap(), 100);
        assert_eq!(buf.len(), 110);
        drop(a);
        assert_eq!(read_into(b.as_raw_fd(), &mut buf, 16).unwrap(), 0);
        assert!(read_into(-1, &mut buf, 16).is_err());
    }

    #[test]
    fn peer_credentials_are_this_process() {
        let (a, _b) = UnixStream::pair().unwrap();
        let (pid, uid, gid) = peer_cred(a.as_raw_fd()).unwrap();
        assert_eq!(pid, std::process::id() as i32);
        // SAFETY: getuid and getgid cannot fail and touch no memory of ours.
        let (me, my_group) = unsafe { (libc::getuid(), libc::getgid()) };
        assert_eq!((uid, gid), (me, my_group));
        assert!(peer_cred(-1).is_err());
    }
}

/// `transport::io::read_into`, our own `unsafe` (a read into uninitialised spare
/// capacity, then `set_len`), over a pipe: its own test uses a Unix socket pair, which
/// Miri cannot write to, and this one runs under `cargo +nightly miri test` (see
/// docs/FUZZING.md).
#[cfg(test)]
mod miri_tests {
    use bytes::BytesMut;

    use super::read_into;

    fn pipe() -> (i32, i32) {
        let mut fds = [0; 2];
        // SAFETY: `fds` is two writable `c_int`s, as pipe(2) needs.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        (fds[0], fds[1])
    }

    fn write(fd: i32, bytes: &[u8]) {
        // SAFETY: `bytes` is readable for its length.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        assert_eq!(usize::try_from(n).ok(), Some(bytes.len()));
    }

    #[test]
    fn read_into_appends_exactly_what_arrived() {
        let (r, w) = pipe();
        let mut buf = BytesMut::from(&b"head:"[..]);
        write(w, b"hello");
        assert_eq!(read_into(r, &mut buf, 16).expect("read"), 5);
        assert_eq!(&buf[..], b"head:hello");
        // A read capped below what is waiting; the rest comes next time.
        write(w, &[7; 40]);
        assert_eq!(read_into(r, &mut buf, 32).expect("read"), 32);
        assert_eq!(read_into(r, &mut buf, 32).expect("read"), 8);
        assert_eq!(buf.len(), 50);
        assert!(buf[10..].iter().all(|&b| b == 7));
        // Every byte is initialised: reading them all is defined.
        assert_eq!(buf.iter().map(|&b| u32::from(b)).sum::<u32>(), 992 + 40 * 7);
        // SAFETY: `w` is an open descriptor this test owns.
        unsafe { libc::close(w) };
        assert_eq!(read_into(r, &mut buf, 16).expect("end of stream"), 0);
        // SAFETY: as above, for `r`.
        unsafe { libc::close(r) };
        assert!(read_into(-1, &mut buf, 16).is_err());
    }
}
