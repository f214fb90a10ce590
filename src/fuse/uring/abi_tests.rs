use super::*;
use fuser::INodeNo;

/// A ring entry as the kernel fills it: `fuse_in_header`, the operation's header, and the
/// payload with its length.
fn entry(opcode: u32, nodeid: u64, op_in: &[u8], payload: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut h = vec![0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&(40 + op_in.len() as u32 + payload.len() as u32).to_le_bytes());
    h[4..8].copy_from_slice(&opcode.to_le_bytes());
    h[8..16].copy_from_slice(&77u64.to_le_bytes());
    h[16..24].copy_from_slice(&nodeid.to_le_bytes());
    h[24..28].copy_from_slice(&1000u32.to_le_bytes());
    h[32..36].copy_from_slice(&4242u32.to_le_bytes());
    h[128..128 + op_in.len()].copy_from_slice(op_in);
    h[264..272].copy_from_slice(&77u64.to_le_bytes());
    h[272..276].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    let mut p = vec![0xAAu8; 4096];
    p[..payload.len()].copy_from_slice(payload);
    (h, p)
}

fn read_in(offset: u64, size: u32) -> Vec<u8> {
    let mut b = vec![0u8; 40];
    b[0..8].copy_from_slice(&9u64.to_le_bytes());
    b[8..16].copy_from_slice(&offset.to_le_bytes());
    b[16..20].copy_from_slice(&size.to_le_bytes());
    b
}

#[test]
fn requests_are_parsed_from_the_header_and_the_payload() {
    let (h, p) = entry(1, 1, &[], b"n01440764\0");
    let (ih, op) = parse(&h, &p).unwrap();
    assert_eq!(
        ih,
        InHeader {
            opcode: 1,
            unique: 77,
            nodeid: 1,
            uid: 1000,
            pid: 4242
        }
    );
    assert_eq!(op, Op::Lookup(b"n01440764"));
    assert_eq!(commit_id(&h), 77);
    let (h, p) = entry(15, 5, &read_in(1 << 20, 131072), &[]);
    assert_eq!(
        parse(&h, &p).unwrap().1,
        Op::Read {
            offset: 1 << 20,
            size: 131072
        }
    );
    let (h, p) = entry(44, 1, &read_in(3, 4096), &[]);
    let want = Op::Readdir {
        offset: 3,
        size: 4096,
        plus: true,
    };
    assert_eq!(parse(&h, &p).unwrap().1, want);
    let mut w = read_in(0, 5);
    w[16..20].copy_from_slice(&5u32.to_le_bytes());
    let (h, p) = entry(16, 9, &w, b"0 1 2");
    assert_eq!(
        parse(&h, &p).unwrap().1,
        Op::Write {
            offset: 0,
            data: b"0 1 2"
        }
    );
    let mut s = vec![0u8; 88];
    s[0..4].copy_from_slice(&(1u32 << 3).to_le_bytes());
    let (h, p) = entry(4, 9, &s, &[]);
    assert_eq!(parse(&h, &p).unwrap().1, Op::Setattr(Some(0)));
    s[0..4].copy_from_slice(&1u32.to_le_bytes());
    let (h, p) = entry(4, 9, &s, &[]);
    assert_eq!(parse(&h, &p).unwrap().1, Op::Setattr(None));
    for (code, op) in [
        (9, Op::Change),
        (35, Op::Change),
        (22, Op::Unsupported),
        (14, Op::Open),
    ] {
        let (h, p) = entry(code, 1, &[], &[]);
        assert_eq!(parse(&h, &p).unwrap().1, op, "opcode {code}");
    }
}

#[test]
fn malformed_entries_are_errors_not_panics() {
    let (h, p) = entry(1, 1, &[], b"name-without-nul");
    assert_eq!(parse(&h, &p), Err(ParseError::Args(1)));
    let (h, p) = entry(1, 1, &[], b"\0");
    assert_eq!(parse(&h, &p), Err(ParseError::Args(1)));
    let (h, p) = entry(1, 1, &[], b"a\0b\0");
    assert_eq!(parse(&h, &p), Err(ParseError::Args(1)));
    let (h, _) = entry(1, 1, &[], b"a\0");
    assert_eq!(parse(&h, &[0u8; 1]), Err(ParseError::Payload(2, 1)));
    assert_eq!(parse(&h[..100], &[]), Err(ParseError::Header(100)));
    // A WRITE whose size is past the payload it came with.
    let (h, p) = entry(16, 9, &read_in(0, 64), b"short");
    assert_eq!(parse(&h, &p), Err(ParseError::Args(16)));
}

fn file(ino: u64, size: u64, mtime: SystemTime) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: size.div_ceil(512),
        atime: mtime,
        mtime,
        ctime: mtime,
        crtime: mtime,
        kind: FileType::RegularFile,
        perm: 0o444,
        nlink: 1,
        uid: 1000,
        gid: 100,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

#[test]
fn replies_have_the_kernel_layout() {
    let t = UNIX_EPOCH + Duration::new(1_700_000_000, 5);
    let a = attr(&file(42, 110_000, t));
    assert_eq!(u64::from_le_bytes(a[0..8].try_into().unwrap()), 42);
    assert_eq!(u64::from_le_bytes(a[8..16].try_into().unwrap()), 110_000);
    assert_eq!(
        u64::from_le_bytes(a[32..40].try_into().unwrap()),
        1_700_000_000
    );
    assert_eq!(u32::from_le_bytes(a[52..56].try_into().unwrap()), 5);
    assert_eq!(
        u32::from_le_bytes(a[60..64].try_into().unwrap()),
        libc::S_IFREG | 0o444
    );
    assert_eq!(u32::from_le_bytes(a[64..68].try_into().unwrap()), 1);
    assert_eq!(u32::from_le_bytes(a[80..84].try_into().unwrap()), 4096);
    // Before 1970: seconds round down, nanoseconds stay positive.
    let old = attr(&file(1, 0, UNIX_EPOCH - Duration::new(1, 250_000_000)));
    assert_eq!(i64::from_le_bytes(old[32..40].try_into().unwrap()), -2);
    assert_eq!(
        u32::from_le_bytes(old[52..56].try_into().unwrap()),
        750_000_000
    );
    let e = entry_out(&file(42, 1, t), Duration::new(86400, 7));
    assert_eq!(u64::from_le_bytes(e[0..8].try_into().unwrap()), 42);
    assert_eq!(u64::from_le_bytes(e[16..24].try_into().unwrap()), 86400);
    assert_eq!(u32::from_le_bytes(e[36..40].try_into().unwrap()), 7);
    assert_eq!(&e[40..], &attr(&file(42, 1, t))[..]);
    let mut h = vec![0xFFu8; HEADER_LEN];
    set_reply(&mut h, 77, libc::ENOENT, 0);
    assert_eq!(u32::from_le_bytes(h[0..4].try_into().unwrap()), 16);
    assert_eq!(
        i32::from_le_bytes(h[4..8].try_into().unwrap()),
        -libc::ENOENT
    );
    assert_eq!(u64::from_le_bytes(h[8..16].try_into().unwrap()), 77);
    assert_eq!(u32::from_le_bytes(h[272..276].try_into().unwrap()), 0);
}

#[test]
fn directory_entries_are_padded_and_stop_when_full() {
    let mut buf = vec![0xEEu8; 64];
    let mut d = DirBuf::new(&mut buf);
    assert!(!d.add(None, 5, 1, FileType::Directory, b"abc"));
    assert_eq!(d.used(), 32);
    // 24 + 9 bytes padded to 40 does not fit in the 32 left.
    assert!(d.add(None, 6, 2, FileType::RegularFile, b"x.JPEG123"));
    assert!(!d.add(None, 6, 2, FileType::RegularFile, b"x.JPEG"));
    assert_eq!(d.used(), 64);
    assert_eq!(u32::from_le_bytes(buf[16..20].try_into().unwrap()), 3);
    assert_eq!(
        u32::from_le_bytes(buf[20..24].try_into().unwrap()),
        libc::DT_DIR as u32
    );
    assert_eq!(&buf[24..32], b"abc\0\0\0\0\0");
    let mut big = vec![0u8; 512];
    let mut d = DirBuf::new(&mut big);
    let e = entry_out(&file(6, 3, UNIX_EPOCH), Duration::from_secs(1));
    assert!(!d.add(Some(&e), 6, 1, FileType::RegularFile, b"f"));
    assert_eq!(d.used(), 128 + 32);
    assert_eq!(&big[..128], &e[..]);
    assert_eq!(u64::from_le_bytes(big[128..136].try_into().unwrap()), 6);
}
