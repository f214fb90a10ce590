//! Pack format and `loosefs pack/info/verify` on real files, without mounting: round trip
//! against the source, zip compatibility (zip crate, Python zipfile, unzip), corrupt inputs,
//! and the namespace driven directly.

mod common;

use common::*;
use loosefs::catalog::native::NativeCatalog;
use loosefs::catalog::{Attr, Catalog, DirEntry, FsError};
use loosefs::ino::ROOT_INO;
use loosefs::pack::reader::Pack;
use loosefs::pack::{FormatError, INDEX_MEMBER};
use loosefs::samples::{CHECK_CHUNK, Samples};
use std::sync::Arc;

/// The native catalog of a pack and checked reads from its local file, with no mount.
struct Ns {
    cat: Arc<NativeCatalog>,
    samples: Samples,
}

impl Ns {
    fn new(p: Pack) -> Ns {
        let storage = Arc::new(p.storage().unwrap());
        let cat = Arc::new(NativeCatalog::new(p, Default::default()));
        let samples = Samples::new(cat.clone(), storage);
        Ns { cat, samples }
    }
    fn readdir(
        &self,
        ino: u64,
        off: u64,
    ) -> Result<std::vec::IntoIter<DirEntry<'static>>, FsError> {
        let mut v = Vec::new();
        self.cat.readdir(ino, off, &mut |e| {
            v.push(DirEntry {
                name: e.name.into_owned().into(),
                ..e
            });
            false
        })?;
        Ok(v.into_iter())
    }
    fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr, FsError> {
        self.cat.lookup(parent, name)
    }
    fn getattr(&self, ino: u64) -> Result<Attr, FsError> {
        self.cat.getattr(ino)
    }
    fn path_of(&self, ino: u64) -> String {
        self.cat.path_of(ino)
    }
    fn next_file(&self, ino: u64) -> Option<u64> {
        self.cat.next_file(ino)
    }
    fn read<'b>(
        &self,
        ino: u64,
        off: u64,
        size: u32,
        buf: &'b mut Vec<u8>,
    ) -> Result<&'b [u8], FsError> {
        self.samples.read(ino, off, size, buf)
    }
}
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

fn pack(src: &Path, out: &Path, extra: &[&str]) {
    let o = Command::new(bin())
        .arg("pack")
        .arg(src)
        .arg(out)
        .args(extra)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "pack failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn tree_and_pack(align: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    make_tree(&src);
    let out = tmp.path().join("t.pack");
    pack(&src, &out, &["--align", align]);
    (tmp, src, out)
}

/// (width, height, components) of a JPEG of `make_tree`, from how it was encoded: class c,
/// image k is (64 + 8k)x(48 + 4c), grey when k = 3; the nested one is 33x17 colour.
fn known_jpeg(path: &str) -> (u32, u32, u8) {
    if path == "class_1/nested/deeper/x.JPEG" {
        return (33, 17, 3);
    }
    let c: u32 = path[6..7].parse().unwrap();
    let k: u32 = path[path.len() - 6..path.len() - 5].parse().unwrap();
    (64 + 8 * k, 48 + 4 * c, if k == 3 { 1 } else { 3 })
}

#[test]
fn pack_round_trips_every_file_and_index_field() {
    for align in ["4096", "1"] {
        let (_tmp, src, out) = tree_and_pack(align);
        let p = Pack::open(&out).unwrap();
        let files = loosefs::verify::file_paths(&p);
        let names: Vec<String> = files.iter().map(|(n, _)| n.clone()).collect();
        assert_eq!(
            names,
            common::files(&src),
            "pack order is the sorted walk order"
        );
        let ix = p.index();
        let mut last_end = 0;
        for (path, i) in &files {
            let r = ix.record(*i).unwrap();
            let s = std::fs::metadata(src.join(path)).unwrap();
            let bytes = std::fs::read(src.join(path)).unwrap();
            assert_eq!(p.data(&r).unwrap(), &bytes[..], "{path}");
            assert_eq!(
                (r.size, r.mode, r.mtime_sec, r.mtime_nsec as i64),
                (s.len(), s.mode(), s.mtime(), s.mtime_nsec())
            );
            assert_eq!(r.crc32, crc32fast::hash(&bytes));
            assert_eq!(
                r.data_off % align.parse::<u64>().unwrap(),
                0,
                "{path} aligned"
            );
            assert!(r.data_off >= last_end, "data in pack order");
            last_end = r.data_off + r.size;
            if path.ends_with(".JPEG") {
                // Oracle: the sizes make_tree encoded, not the packer's own header probe.
                assert_eq!(
                    (r.width, r.height, r.components),
                    known_jpeg(path),
                    "{path}"
                );
            } else {
                assert_eq!(r.components, 0);
            }
        }
        let t = p.totals();
        assert_eq!((t.files, t.jpegs), (14, 13));
        assert!(loosefs::verify::verify(&p, Some(&src)).unwrap().is_empty());
    }
}

#[test]
fn zip_tools_accept_the_pack_and_extract_the_source_tree() {
    let (tmp, src, out) = tree_and_pack("4096");
    // The zip crate: every member stored, aligned, offsets equal to the index.
    let p = Pack::open(&out).unwrap();
    let by_path: std::collections::HashMap<_, _> =
        loosefs::verify::file_paths(&p).into_iter().collect();
    let mut z = zip::ZipArchive::new(std::fs::File::open(&out).unwrap()).unwrap();
    let mut seen_index = false;
    for k in 0..z.len() {
        let f = z.by_index_raw(k).unwrap();
        assert_eq!(f.compression(), zip::CompressionMethod::Stored);
        if f.is_dir() {
            continue;
        }
        if f.name() == INDEX_MEMBER {
            seen_index = true;
            continue;
        }
        let r = p.index().record(by_path[f.name()]).unwrap();
        assert_eq!(
            (f.data_start(), f.size(), f.crc32()),
            (r.data_off, r.size, r.crc32),
            "{}",
            f.name()
        );
    }
    assert!(seen_index);
    // Python's zipfile tests every CRC and extracts the source tree plus the one dot-file.
    let ex = tmp.path().join("extracted");
    let py = "import zipfile,sys; z=zipfile.ZipFile(sys.argv[1]); assert z.testzip() is None; z.extractall(sys.argv[2])";
    let o = Command::new("python3")
        .args(["-c", py])
        .arg(&out)
        .arg(&ex)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "python zipfile: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(ex.join(INDEX_MEMBER).is_file());
    std::fs::remove_file(ex.join(INDEX_MEMBER)).unwrap();
    assert_eq!(files(&ex), files(&src));
    for f in files(&src) {
        assert_eq!(
            std::fs::read(ex.join(&f)).unwrap(),
            std::fs::read(src.join(&f)).unwrap(),
            "{f}"
        );
    }
    assert!(
        ex.join("empty_class").is_dir(),
        "empty directories are kept"
    );
    if Path::new("/usr/bin/unzip").exists() {
        let o = Command::new("unzip").arg("-tq").arg(&out).output().unwrap();
        assert!(
            o.status.success(),
            "unzip -t: {}",
            String::from_utf8_lossy(&o.stdout)
        );
    }
}

#[test]
fn namespace_lookups_listings_and_reads() {
    let (_tmp, src, out) = tree_and_pack("4096");
    let ns = Ns::new(Pack::open(&out).unwrap());
    let names = |ino| -> Vec<String> {
        ns.readdir(ino, 0)
            .unwrap()
            .map(|e| String::from_utf8_lossy(&e.name).into_owned())
            .collect()
    };
    assert_eq!(
        names(ROOT_INO),
        [".", "..", "class_0", "class_1", "class_2", "empty_class"]
    );
    assert!(
        !names(ROOT_INO).contains(&INDEX_MEMBER.to_string()),
        "the index is hidden"
    );
    assert_eq!(
        ns.lookup(ROOT_INO, INDEX_MEMBER.as_bytes()),
        Err(FsError::NotFound)
    );
    let c1 = ns.lookup(ROOT_INO, b"class_1").unwrap();
    assert_eq!(
        names(c1.ino),
        [
            ".",
            "..",
            "img_0.JPEG",
            "img_1.JPEG",
            "img_2.JPEG",
            "img_3.JPEG",
            "nested"
        ]
    );
    // readdir resumes after any entry it returned (offsets are the entries' cookies).
    let after_img_2 = ns.readdir(c1.ino, 0).unwrap().nth(4).unwrap();
    assert_eq!(&*after_img_2.name, b"img_2.JPEG");
    let tail: Vec<_> = ns
        .readdir(c1.ino, after_img_2.next_offset)
        .unwrap()
        .map(|e| e.name.to_vec())
        .collect();
    assert_eq!(tail, [b"img_3.JPEG".to_vec(), b"nested".to_vec()]);
    assert_eq!(ns.readdir(c1.ino, 99).unwrap().count(), 0);
    let nested = ns.lookup(c1.ino, b"nested").unwrap();
    let deeper = ns.lookup(nested.ino, b"deeper").unwrap();
    let x = ns.lookup(deeper.ino, b"x.JPEG").unwrap();
    assert_eq!(ns.lookup(x.ino, b"y"), Err(FsError::NotDir));
    assert_eq!(ns.lookup(deeper.ino, b"..").unwrap().ino, nested.ino);
    assert_eq!(ns.path_of(x.ino), "class_1/nested/deeper/x.JPEG");
    let bytes = std::fs::read(src.join("class_1/nested/deeper/x.JPEG")).unwrap();
    assert_eq!(x.size, bytes.len() as u64);
    assert_eq!(
        x.perm,
        (std::fs::metadata(src.join("class_1/nested/deeper/x.JPEG"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7555) as u16
    );
    // Reads at every offset, short reads at the end, empty past the end.
    for off in [0u64, 1, 100, x.size - 1, x.size, x.size + 10] {
        let mut buf = Vec::new();
        let got = ns.read(x.ino, off, 4096, &mut buf).unwrap();
        let lo = (off as usize).min(bytes.len());
        assert_eq!(got, &bytes[lo..(lo + 4096).min(bytes.len())]);
    }
    assert_eq!(
        ns.read(deeper.ino, 0, 10, &mut Vec::new()),
        Err(FsError::IsDir)
    );
    assert_eq!(ns.getattr(0), Err(FsError::NotFound));
    assert_eq!(ns.getattr(u64::MAX), Err(FsError::NotFound));
    assert_eq!(ns.lookup(ROOT_INO, b"nope"), Err(FsError::NotFound));
    assert_eq!(ns.readdir(x.ino, 0).unwrap_err(), FsError::NotDir);
}

/// Offset of the data of `rel` inside the pack at `out`.
fn data_offset(out: &Path, rel: &str) -> u64 {
    let p = Pack::open(out).unwrap();
    let (_, i) = loosefs::verify::file_paths(&p)
        .into_iter()
        .find(|(n, _)| n == rel)
        .unwrap();
    p.index().record(i).unwrap().data_off
}

/// Rewrites the index of the pack at `path` as a forger would: `edit` changes the index bytes,
/// then the checksum is recomputed so only the tree check can catch it.
fn forge_index(path: &Path, edit: impl FnOnce(&mut [u8])) {
    let mut bytes = std::fs::read(path).unwrap();
    let t = loosefs::pack::trailer::Trailer::parse_tail(&bytes[bytes.len() - 4096..]).unwrap();
    let ix = &mut bytes[t.index_offset as usize..(t.index_offset + t.index_len) as usize];
    edit(ix);
    let c = loosefs::pack::index::checksum(ix);
    ix[120..128].copy_from_slice(&c.to_le_bytes());
    std::fs::write(path, bytes).unwrap();
}

fn flip(path: &Path, at: u64) {
    let mut b = std::fs::read(path).unwrap();
    b[at as usize] ^= 0x55;
    std::fs::write(path, b).unwrap();
}

#[test]
fn corrupt_packs_are_refused_with_the_reason() {
    let (tmp, _src, out) = tree_and_pack("4096");
    let good = std::fs::read(&out).unwrap();
    let bad = tmp.path().join("bad.pack");
    let err = |bytes: &[u8]| -> FormatError {
        std::fs::write(&bad, bytes).unwrap();
        Pack::open(&bad).expect_err("a corrupt pack must be refused")
    };
    // Truncated anywhere: no trailer any more.
    for cut in [1usize, 30, 100, good.len() / 2, good.len() - 8] {
        let e = err(&good[..good.len() - cut]);
        assert!(matches!(e, FormatError::NotAPack(_)), "cut {cut}: {e}");
        assert!(e.to_string().contains("truncated"), "{e}");
    }
    assert!(matches!(err(&good[..1]), FormatError::NotAPack(_)));
    assert!(matches!(err(b""), FormatError::NotAPack(_)));
    assert!(matches!(
        err(b"hello, not a zip at all"),
        FormatError::NotAPack(_)
    ));
    // A flipped byte inside the index: checksum.
    let p = Pack::open(&out).unwrap();
    let ix_off = p.map().len() - 53 - 22; // rough: somewhere before the central directory
    drop(p);
    let trailer = loosefs::pack::trailer::Trailer::parse_tail(&good).unwrap();
    let mut b = good.clone();
    b[(trailer.index_offset + 200) as usize] ^= 1;
    assert!(matches!(err(&b), FormatError::Checksum { .. }));
    // Bad magic.
    let mut b = good.clone();
    b[trailer.index_offset as usize] = b'X';
    assert!(matches!(err(&b), FormatError::NotAPack(_)));
    // Trailer pointing past the end.
    let mut b = good.clone();
    let t = loosefs::pack::trailer::Trailer {
        index_offset: ix_off as u64 * 4,
        ..trailer
    };
    let n = b.len();
    b[n - 53..].copy_from_slice(t.encode().as_bytes());
    assert!(matches!(err(&b), FormatError::Truncated(_)));
    // A damaged trailer leaves a valid zip that names the pack index: the CLI refuses it as a
    // damaged pack (it was served as a plain zip of the pack's members, index included).
    let mut b = good.clone();
    let n = b.len();
    b[n - 5] = b'h';
    std::fs::write(&bad, &b).unwrap();
    let o = loosefs(&[&"info", &bad, &"--index-dir", &tmp.path().join("ix")]);
    assert_eq!(o.status.code(), Some(65));
    let msg = String::from_utf8_lossy(&o.stderr);
    assert!(
        msg.contains("bad.pack") && msg.contains("whose end is damaged"),
        "{msg}"
    );
    // A foreign zip (written by Python's zipfile) is not a loosefs pack.
    let foreign = tmp.path().join("foreign.zip");
    let py = "import zipfile,sys; z=zipfile.ZipFile(sys.argv[1],'w'); z.writestr('../evil.txt','x'); z.writestr('/abs.txt','y'); z.close()";
    assert!(
        Command::new("python3")
            .args(["-c", py])
            .arg(&foreign)
            .status()
            .unwrap()
            .success()
    );
    let e = Pack::open(&foreign).unwrap_err();
    assert!(
        e.to_string()
            .contains("zip archive without a loosefs trailer"),
        "{e}"
    );
    // The CLI names the file and the reason, exit code 2: read as a zip dataset (not a pack),
    // its escaping member is what is wrong with it.
    let o = loosefs(&[&"info", &foreign]);
    assert_eq!(o.status.code(), Some(65));
    let msg = String::from_utf8_lossy(&o.stderr);
    assert!(
        msg.contains("foreign.zip") && msg.contains("../evil.txt") && msg.contains("escape"),
        "{msg}"
    );
}

#[test]
fn verify_names_each_mismatch() {
    let (_tmp, src, out) = tree_and_pack("4096");
    let o = loosefs(&[&"verify", &out, &"--against", &src]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    // Damage one sample's data in the pack and change another in the source.
    flip(&out, data_offset(&out, "class_2/img_1.JPEG") + 10);
    let changed = src.join("class_0/img_0.JPEG");
    let mut b = std::fs::read(&changed).unwrap();
    b[20] ^= 1;
    std::fs::write(&changed, b).unwrap();
    std::fs::write(src.join("class_0/new.JPEG"), encode_jpeg(8, 8, false, 1)).unwrap();
    let o = loosefs(&[&"verify", &out, &"--against", &src]);
    assert_eq!(o.status.code(), Some(1));
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(s.contains("class_2/img_1.JPEG: CRC-32"), "{s}");
    assert!(s.contains("class_0/img_0.JPEG: differs"), "{s}");
    assert!(s.contains("class_0/new.JPEG: in"), "{s}");
    assert_eq!(s.lines().count(), 3, "{s}");
}

#[test]
fn pack_refuses_bad_input_and_loses_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    make_tree(&src);
    let out = tmp.path().join("o.pack");
    // Missing source.
    let o = loosefs(&[&"pack", &tmp.path().join("missing"), &out]);
    assert_eq!(o.status.code(), Some(66));
    assert!(String::from_utf8_lossy(&o.stderr).contains("missing"));
    assert!(!out.exists());
    // Source is a file.
    let o = loosefs(&[&"pack", &src.join("class_0/notes.txt"), &out]);
    assert_eq!(o.status.code(), Some(65));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a directory"));
    // Output directory missing.
    let o = loosefs(&[&"pack", &src, &tmp.path().join("no/such/dir/o.pack")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("does not exist"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // OUT exists: refused and untouched unless --force.
    std::fs::write(&out, b"precious").unwrap();
    let o = loosefs(&[&"pack", &src, &out]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("already exists"));
    assert_eq!(std::fs::read(&out).unwrap(), b"precious");
    pack(&src, &out, &["--force"]);
    assert!(Pack::open(&out).is_ok());
    // Bad alignment.
    let o = loosefs(&[
        &"pack",
        &src,
        &tmp.path().join("a.pack"),
        &"--align",
        &"3000",
    ]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("power of two"));
    assert!(!tmp.path().join("a.pack").exists());
    // No temp files left behind.
    let leftovers: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn symlinks_and_special_files_are_reported_and_skipped_or_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    make_tree(&src);
    std::os::unix::fs::symlink(
        src.join("class_0/img_0.JPEG"),
        src.join("class_2/link.JPEG"),
    )
    .unwrap();
    nix::unistd::mkfifo(
        &src.join("class_2/fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let out = tmp.path().join("s.pack");
    let o = loosefs(&[&"pack", &src, &out]);
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("link.JPEG") && err.contains("symbolic link"),
        "{err}"
    );
    assert!(
        err.contains("fifo") && err.contains("special file"),
        "{err}"
    );
    let names: Vec<String> = loosefs::verify::file_paths(&Pack::open(&out).unwrap())
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert!(
        !names
            .iter()
            .any(|n| n.contains("link") || n.contains("fifo"))
    );
    let out2 = tmp.path().join("f.pack");
    let o = loosefs(&[&"pack", &src, &out2, &"--follow-links"]);
    assert!(o.status.success());
    let p = Pack::open(&out2).unwrap();
    let (_, i) = loosefs::verify::file_paths(&p)
        .into_iter()
        .find(|(n, _)| n == "class_2/link.JPEG")
        .expect("followed link packed");
    assert_eq!(
        p.data(&p.index().record(i).unwrap()).unwrap(),
        &std::fs::read(src.join("class_0/img_0.JPEG")).unwrap()[..]
    );
}

#[test]
fn interrupted_pack_leaves_nothing_named_out() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    // Enough data that the pack takes a while.
    for c in 0..8 {
        let d = src.join(format!("c{c}"));
        std::fs::create_dir_all(&d).unwrap();
        for k in 0..40 {
            std::fs::write(
                d.join(format!("{k}.bin")),
                vec![(c * 40 + k) as u8; 1 << 20],
            )
            .unwrap();
        }
    }
    let out = tmp.path().join("big.pack");
    let temps = || -> Vec<PathBuf> {
        std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().ends_with(".tmp"))
            .collect()
    };
    // Starts a pack and returns it once its temp file holds data (it is under way).
    let start = || {
        let child = Command::new(bin())
            .arg("pack")
            .arg(&src)
            .arg(&out)
            .arg("--jobs")
            .arg("1")
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let t = std::time::Instant::now();
        while !temps()
            .iter()
            .any(|p| std::fs::metadata(p).is_ok_and(|m| m.len() > 1 << 20))
        {
            assert!(t.elapsed().as_secs() < 20, "the pack never started writing");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        child
    };
    use nix::sys::signal::Signal;
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        let child = start();
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig).unwrap();
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{sig}: {err}");
        assert!(err.contains("interrupted"), "{sig}: {err}");
        assert!(
            !out.exists(),
            "{sig}: an interrupted pack must not leave {out:?}"
        );
        assert!(temps().is_empty(), "{sig}: temp files left: {:?}", temps());
    }
    // A killed pack cannot clean up; the next pack of the same output does.
    let mut child = start();
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(temps().len(), 1, "SIGKILL leaves its temp file");
    let o = loosefs(&[&"pack", &src, &out]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("removed") && err.contains("killed"), "{err}");
    assert!(temps().is_empty(), "left: {:?}", temps());
    assert!(Pack::open(&out).is_ok());
}

#[test]
fn info_reports_counts() {
    let (_tmp, _src, out) = tree_and_pack("4096");
    let o = loosefs(&[&"info", &out, &"--json"]);
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["samples"], 14);
    assert_eq!(v["jpeg_files"], 13);
    assert_eq!(v["other_files"], 1);
    assert_eq!(v["directories"], 7); // root, class_0..2, nested, deeper, empty_class
    assert_eq!(v["alignment"], 4096);
    assert_eq!(v["index_version"], 1);
}

#[test]
fn foreign_zip_is_converted_and_escaping_names_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let z = tmp.path().join("foreign.zip");
    // Deflated and stored members, an implied directory, an explicit one, a nested file.
    let py = r#"
import zipfile, sys
with zipfile.ZipFile(sys.argv[1], 'w') as z:
    z.writestr('train/b/x.bin', bytes(range(256)) * 40, compress_type=zipfile.ZIP_DEFLATED)
    z.writestr('train/a/y.txt', b'hello', compress_type=zipfile.ZIP_STORED)
    z.writestr('train/a/', b'')
    z.writestr('train/a/deep/z.txt', b'zz' * 1000, compress_type=zipfile.ZIP_DEFLATED)
"#;
    assert!(
        Command::new("python3")
            .args(["-c", py])
            .arg(&z)
            .status()
            .unwrap()
            .success()
    );
    let out = tmp.path().join("conv.pack");
    pack(&z, &out, &[]);
    let p = Pack::open(&out).unwrap();
    let got: Vec<(String, u32)> = loosefs::verify::file_paths(&p)
        .into_iter()
        .map(|(n, i)| {
            (
                n,
                crc32fast::hash(p.data(&p.index().record(i).unwrap()).unwrap()),
            )
        })
        .collect();
    let want = vec![
        (
            "train/a/deep/z.txt".to_string(),
            crc32fast::hash(&b"zz".repeat(1000)),
        ),
        ("train/a/y.txt".to_string(), crc32fast::hash(b"hello")),
        (
            "train/b/x.bin".to_string(),
            crc32fast::hash(&(0..=255u8).collect::<Vec<_>>().repeat(40)),
        ),
    ];
    assert_eq!(got, want);
    // Names that would escape: refused, naming the member; nothing written.
    for bad in ["../evil.txt", "/etc/abs.txt", "train/../../up.txt"] {
        let ez = tmp.path().join("evil.zip");
        let py = format!(
            "import zipfile,sys; z=zipfile.ZipFile(sys.argv[1],'w'); z.writestr('ok/a.txt','x'); z.writestr({bad:?},'y'); z.close()"
        );
        assert!(
            Command::new("python3")
                .args(["-c", &py])
                .arg(&ez)
                .status()
                .unwrap()
                .success()
        );
        let bad_out = tmp.path().join("evil.pack");
        let o = loosefs(&[&"pack", &ez, &bad_out]);
        assert_eq!(o.status.code(), Some(65), "{bad}");
        let msg = String::from_utf8_lossy(&o.stderr);
        assert!(
            msg.contains("escape") && msg.contains("evil.zip"),
            "{bad}: {msg}"
        );
        assert!(!bad_out.exists());
    }
}

/// Writes a zip with Python's zipfile (which allows what other tools produce: duplicate
/// names, odd names); `members` are (name, content) pairs.
fn python_zip(path: &Path, members: &[(&str, &str)]) {
    let writes: String = members
        .iter()
        .map(|(n, c)| format!("z.writestr({n:?},{c:?});"))
        .collect();
    let py = format!(
        "import zipfile,sys,warnings; warnings.simplefilter('ignore'); z=zipfile.ZipFile(sys.argv[1],'w'); {writes} z.close()"
    );
    let ok = Command::new("python3").args(["-c", &py]).arg(path).status();
    assert!(ok.unwrap().success());
}

#[test]
fn zip_members_are_never_dropped_silently() {
    let tmp = tempfile::tempdir().unwrap();
    let z = tmp.path().join("s.zip");
    let out = tmp.path().join("s.pack");
    let refused = |members: &[(&str, &str)], why: &str| {
        python_zip(&z, members);
        let o = loosefs(&[&"pack", &z, &out, &"--force"]);
        let msg = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(65), "{members:?}: {msg}");
        assert!(msg.contains(why), "{members:?}: {msg}");
        assert!(!out.exists());
    };
    // A name twice (the zip reader keeps only the last copy): refused, naming it.
    refused(
        &[("a.txt", "one"), ("b.txt", "b"), ("a.txt", "two")],
        "\"a.txt\" appears twice",
    );
    refused(&[("x/a.txt", "1"), ("x/a.txt", "2")], "appears twice");
    // File members with no name.
    refused(&[("ok.txt", "x"), (".", "dot")], "names no file");
    // `..` inside the tree resolves; above it refuses with the right reason.
    python_zip(&z, &[("a/../b.txt", "bee"), ("./c/./d.txt", "dee")]);
    let o = loosefs(&[&"pack", &z, &out, &"--force"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let p = Pack::open(&out).unwrap();
    let names: Vec<String> = loosefs::verify::file_paths(&p)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["b.txt", "c/d.txt"]);
    std::fs::remove_file(&out).unwrap();
    refused(&[("a/../../b.txt", "x")], "would escape");
}

#[test]
fn shared_zip_fixture_converts_to_the_original_images() {
    // The shared data is part of this workspace (and of CI's machines): without it this test
    // fails instead of passing unseen.
    let sample = shared_sample().expect("../shared/data/imagenet-sample is absent");
    let z = sample.join("../formats/zip/images.zip");
    assert!(z.exists(), "{} is absent", z.display());
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("z.pack");
    pack(&z, &out, &[]);
    let p = Pack::open(&out).unwrap();
    let files = loosefs::verify::file_paths(&p);
    assert_eq!(files.len(), 48);
    for (name, i) in files {
        let rel = name.strip_prefix("train/").unwrap();
        let want = std::fs::read(sample.join(rel)).unwrap();
        assert_eq!(
            p.data(&p.index().record(i).unwrap()).unwrap(),
            &want[..],
            "{name}"
        );
    }
}

#[test]
fn samples_larger_than_a_check_chunk_are_checked_in_chunks_and_served_by_range() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir_all(src.join("big")).unwrap();
    let n = CHECK_CHUNK + 3 * 4096 + 17;
    let data: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(src.join("big/blob.bin"), &data).unwrap();
    let out = tmp.path().join("b.pack");
    pack(&src, &out, &[]);
    let ns = Ns::new(Pack::open(&out).unwrap());
    let dir = ns.lookup(ROOT_INO, b"big").unwrap();
    let f = ns.lookup(dir.ino, b"blob.bin").unwrap();
    let mut buf = Vec::new();
    for off in [0usize, 4096, CHECK_CHUNK - 5, n - 100] {
        let got = ns.read(f.ino, off as u64, 1 << 20, &mut buf).unwrap();
        assert_eq!(got, &data[off..(off + (1 << 20)).min(n)], "offset {off}");
    }
    // Damage a byte past the first chunk: the chunked check catches it, from any offset.
    let off = data_offset(&out, "big/blob.bin") + n as u64 - 10;
    flip(&out, off);
    let ns = Ns::new(Pack::open(&out).unwrap());
    let dir = ns.lookup(ROOT_INO, b"big").unwrap();
    let f = ns.lookup(dir.ino, b"blob.bin").unwrap();
    assert!(matches!(
        ns.read(f.ino, 0, 4096, &mut buf),
        Err(FsError::Corrupt(_))
    ));
}

#[test]
fn next_file_walks_pack_order() {
    let (_tmp, _src, out) = tree_and_pack("4096");
    let p = Pack::open(&out).unwrap();
    let order: Vec<u64> = loosefs::verify::file_paths(&p)
        .into_iter()
        .map(|(_, i)| u64::from(i) + 1)
        .collect();
    let ns = Ns::new(p);
    let mut walked = Vec::new();
    let mut cur = order[0];
    walked.push(cur);
    while let Some(n) = ns.next_file(cur) {
        walked.push(n);
        cur = n;
    }
    assert_eq!(
        walked, order,
        "successors follow the data order, through nested and empty dirs"
    );
    assert_eq!(ns.next_file(0), None);
}

#[test]
fn packs_with_forged_trees_are_refused_by_info_verify_and_mount() {
    use loosefs::pack::index::{HEADER_LEN, RECORD_LEN};
    let field = |rec: usize, off: usize| HEADER_LEN + rec * RECORD_LEN + off;
    // Record 1 is the first class directory; record 1's first child and child count at +4, +8;
    // a record's parent at +0.
    type Edit = fn(&mut [u8], &dyn Fn(usize, usize) -> usize);
    let forgeries: [(&str, Edit); 3] = [
        ("a directory that is its own child", |ix, f| {
            ix[f(1, 4)..f(1, 4) + 4].copy_from_slice(&1u32.to_le_bytes());
            ix[f(1, 8)..f(1, 8) + 4].copy_from_slice(&1u32.to_le_bytes());
        }),
        (
            "a self-parented file (record 5 is class_0/img_0.JPEG)",
            |ix, f| {
                ix[f(5, 0)..f(5, 0) + 4].copy_from_slice(&5u32.to_le_bytes());
            },
        ),
        ("two directories listing each other", |ix, f| {
            ix[f(1, 4)..f(1, 4) + 4].copy_from_slice(&2u32.to_le_bytes());
            ix[f(2, 4)..f(2, 4) + 4].copy_from_slice(&1u32.to_le_bytes());
        }),
    ];
    for (what, edit) in forgeries {
        let (tmp, _src, out) = tree_and_pack("4096");
        forge_index(&out, |ix| edit(ix, &field));
        let mnt = tmp.path().join("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        for args in [vec!["info"], vec!["verify"], vec!["mount"]] {
            let mut c = Command::new("timeout");
            c.arg("20").arg(bin()).args(&args).arg(&out);
            if args[0] == "mount" {
                c.arg(&mnt);
            }
            let o = c.output().unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(
                o.status.code(),
                Some(65),
                "{what}: {args:?} accepted it: {err}"
            );
            assert!(err.contains("index record"), "{what}: {args:?}: {err}");
        }
    }
}

#[test]
fn a_top_level_loosefs_entry_is_refused_at_pack_time() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir_all(src.join(".loosefs")).unwrap();
    std::fs::write(src.join(".loosefs/stats"), b"mine").unwrap();
    std::fs::create_dir_all(src.join("a/.loosefs")).unwrap();
    std::fs::write(src.join("a/.loosefs/ok"), b"nested is fine").unwrap();
    let out = tmp.path().join("o.pack");
    let o = loosefs(&[&"pack", &src, &out]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(".loosefs") && err.contains("reserved"),
        "{err}"
    );
    assert!(!out.exists(), "nothing written");
    // The same from a zip.
    let zip_path = tmp.path().join("s.zip");
    let mut z = zip::ZipWriter::new(std::fs::File::create(&zip_path).unwrap());
    let opts = zip::write::SimpleFileOptions::default();
    z.start_file(".loosefs/stats", opts).unwrap();
    std::io::Write::write_all(&mut z, b"mine").unwrap();
    z.finish().unwrap();
    let o = loosefs(&[&"pack", &zip_path, &out]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("reserved"), "{err}");
    // Below the top it packs.
    std::fs::remove_dir_all(src.join(".loosefs")).unwrap();
    assert!(loosefs(&[&"pack", &src, &out]).status.success());
}

#[test]
fn verify_checks_the_zip_layer_other_tools_read() {
    let (tmp, _src, out) = tree_and_pack("4096");
    let good = std::fs::read(&out).unwrap();
    // Where the third file member's headers are, from the zip crate.
    let mut z = zip::ZipArchive::new(std::fs::File::open(&out).unwrap()).unwrap();
    let k = (0..z.len())
        .filter(|&k| !z.by_index_raw(k).unwrap().is_dir())
        .nth(2)
        .unwrap();
    let m = z.by_index_raw(k).unwrap();
    let (local, central) = (m.header_start() as usize, m.central_header_start() as usize);
    let name = String::from_utf8_lossy(m.name_raw()).into_owned();
    drop(m);
    // Byte offsets to damage, each in a header field no loosefs read depends on.
    let damage = [
        ("local signature", local + 1),
        ("local CRC-32", local + 14),
        ("local compressed size", local + 18),
        ("local name", local + 30),
        ("central CRC-32", central + 16),
        ("central size", central + 24),
        ("central local-header offset", central + 42),
        ("central name", central + 46),
    ];
    for (what, at) in damage {
        let bad = tmp.path().join("bad.pack");
        let mut b = good.clone();
        b[at] ^= 0x20;
        std::fs::write(&bad, &b).unwrap();
        let o = loosefs(&[&"verify", &bad]);
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert_eq!(
            o.status.code(),
            Some(1),
            "{what} ({name}) passed verify: {stdout}"
        );
        assert!(stdout.contains("MISMATCH"), "{what}: {stdout}");
    }
    // The undamaged pack passes, zip layer included.
    assert!(loosefs(&[&"verify", &out]).status.success());
}

#[test]
fn appended_bytes_are_named_as_such_and_skips_are_listed_once() {
    let (tmp, src, out) = tree_and_pack("4096");
    let bad = tmp.path().join("appended.pack");
    let mut b = std::fs::read(&out).unwrap();
    b.extend_from_slice(b"xyz");
    std::fs::write(&bad, &b).unwrap();
    let o = loosefs(&[&"info", &bad]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(65));
    assert!(
        err.contains("3 bytes were appended") && !err.contains("truncated"),
        "{err}"
    );
    // A skipped entry (a symbolic link) is reported once.
    std::os::unix::fs::symlink("class_0", src.join("link")).unwrap();
    let o = loosefs(&[&"pack", &src, &tmp.path().join("l.pack")]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert_eq!(err.matches("skipped").count(), 1, "{err}");
}

#[test]
#[ignore = "mounts a tmpfs: needs root"]
fn a_full_filesystem_fails_the_pack_cleanly() {
    let _timeout = require_mount();
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("big.bin"), vec![7u8; 1 << 20]).unwrap();
    let small = tmp.path().join("small");
    std::fs::create_dir_all(&small).unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=512k", "tmpfs"])
        .arg(&small)
        .status()
        .unwrap();
    assert!(ok.success());
    let o = loosefs(&[&"pack", &src, &small.join("o.pack")]);
    let left: Vec<_> = std::fs::read_dir(&small)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let _ = Command::new("umount").arg(&small).status();
    let err = String::from_utf8_lossy(&o.stderr);
    // A full disk is a failure of no finer kind (docs/CONFIGURATION.md, "Exit codes").
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("No space left on device"), "{err}");
    assert!(
        !err.contains("ZipWriter"),
        "a stray message from the zip writer: {err}"
    );
    assert_eq!(err.lines().count(), 1, "one clear line: {err}");
    assert!(left.is_empty(), "left on the full filesystem: {left:?}");
}

#[test]
fn a_file_larger_than_memory_allows_is_packed_streaming() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir_all(src.join("d")).unwrap();
    // 300 MB (sparse: no disk used for the source) with a few real bytes.
    let big = src.join("d/big.bin");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(300 << 20).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(b"head", 0).unwrap();
    f.write_all_at(b"tail", (300 << 20) - 4).unwrap();
    drop(f);
    std::fs::write(src.join("d/small.txt"), b"small").unwrap();
    let out = tmp.path().join("big.pack");
    // Peak RSS of the packer, from the kernel's accounting of a child that ran alone.
    let py = "import resource,subprocess,sys; r=subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL); \
              print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)";
    let o = Command::new("python3")
        .args(["-c", py, bin(), "pack"])
        .arg(&src)
        .arg(&out)
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&o.stdout);
    let mut it = line.split_whitespace();
    let (rc, peak_kb): (i32, u64) = (
        it.next().unwrap().parse().unwrap(),
        it.next().unwrap().parse().unwrap(),
    );
    assert_eq!(rc, 0, "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        peak_kb < 100 << 10,
        "packing a 300 MB file peaked at {peak_kb} kB"
    );
    let p = Pack::open(&out).unwrap();
    assert!(loosefs::verify::verify(&p, Some(&src)).unwrap().is_empty());
}

#[test]
fn alignment_padding_stays_out_of_the_central_directory() {
    // 70,000 files of 64 B: more entries than a plain zip end record counts, so the ZIP64 end
    // records are rewritten too.
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    for d in 0..70 {
        let dir = src.join(format!("d{d:02}"));
        std::fs::create_dir_all(&dir).unwrap();
        for k in 0..1000 {
            std::fs::write(dir.join(format!("{k:04}.bin")), [d as u8; 64]).unwrap();
        }
    }
    let out = tmp.path().join("tiny.pack");
    pack(&src, &out, &[]);
    let len = std::fs::metadata(&out).unwrap().len();
    let z = zip::ZipArchive::new(std::fs::File::open(&out).unwrap()).unwrap();
    assert_eq!(z.len(), 70_000 + 70 + 1, "files, directories and the index");
    let cd = len - z.central_directory_start();
    // Each central record: 46 bytes + a name of 12 bytes + a zip64 field at most; no padding.
    assert!(
        cd < 70_071 * 100,
        "central directory of {cd} bytes for 70,071 entries"
    );
    // Local headers keep the padding: data stays aligned, and the pack is what it was.
    let p = Pack::open(&out).unwrap();
    assert!(loosefs::verify::verify(&p, Some(&src)).unwrap().is_empty());
    let py = "import zipfile,sys; z=zipfile.ZipFile(sys.argv[1]); assert z.testzip() is None; print(len(z.namelist()))";
    let o = Command::new("python3")
        .args(["-c", py])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "70071");
}
