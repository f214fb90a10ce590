//! Writes a synthetic pack with many small samples, for scale tests of the index (mount time,
//! daemon memory, `stat` latency) without creating millions of source files.
//!
//!     cargo run --release --example synth_pack -- OUT.pack [SAMPLES=1281167] [CLASSES=1000]
//!
//! Layout mirrors ImageNet-1k train: CLASSES directories `n%08d`, samples spread evenly, each a
//! few hundred bytes, data unaligned (`--align 1` equivalent) to keep the file small.

use loosefs::pack::writer::{EntryMeta, PackWriter, ROOT};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let out = args
        .get(1)
        .expect("usage: synth_pack OUT [SAMPLES] [CLASSES]");
    let samples: usize = args.get(2).map_or(Ok(1_281_167), |s| s.parse())?;
    let classes: usize = args.get(3).map_or(Ok(1000), |s| s.parse())?;
    let meta = |mode| EntryMeta {
        mode,
        mtime_sec: 1_700_000_000,
        mtime_nsec: 0,
    };
    let tmp = format!("{out}.tmp");
    let mut w = PackWriter::new(std::fs::File::create(&tmp)?, 1, meta(0o40755))?;
    let mut done = 0;
    for c in 0..classes {
        let dir = w.add_dir(ROOT, &format!("n{c:08}"), meta(0o40755))?;
        let n = samples / classes + usize::from(c < samples % classes);
        for k in 0..n {
            let data = format!("sample {c} {k} ").repeat(16).into_bytes();
            let crc = crc32fast::hash(&data);
            w.add_file(
                dir,
                &format!("n{c:08}_{k:07}.JPEG"),
                meta(0o100644),
                &data,
                crc,
                None,
            )?;
            done += 1;
        }
    }
    w.finish()?.sync_all()?;
    std::fs::rename(&tmp, out)?;
    println!("wrote {done} samples in {classes} classes to {out}");
    Ok(())
}
