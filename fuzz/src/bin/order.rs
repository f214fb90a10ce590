//! Fuzz target: announced orders (what any user of a mount may write to `.loosefs/order`).
//! One server over a small pack lives for the whole run; each input is written as one
//! announcement: byte 0 sets the write size (1–256 bytes), byte 1 the writing process, and
//! byte 2 = 0xff restarts at a wrong offset once. Some files are then read, so the reads meet
//! the order. Errors are expected; a panic, a hang or unbounded growth is a finding.
use loosefs::server::{Server, ServerOptions};
use std::sync::OnceLock;

fn server() -> &'static (Server, u64, Vec<u64>) {
    static S: OnceLock<(Server, u64, Vec<u64>)> = OnceLock::new();
    S.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir").keep();
        let tree = dir.join("tree");
        for k in 0..64u32 {
            let d = tree.join(format!("c{}", k % 4));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(
                d.join(format!("f{k}.bin")),
                vec![k as u8; 100 + k as usize * 37],
            )
            .unwrap();
        }
        let pack = dir.join("p.pack");
        let opts = loosefs::packer::PackOptions {
            jobs: 1,
            align: 1,
            follow_links: false,
            force: true,
            progress: loosefs::packer::Progress::None,
            source: Default::default(),
        };
        loosefs::packer::pack_dir(&tree, &pack, &opts).expect("pack");
        let opts = ServerOptions {
            readahead: loosefs::readahead::ReadAheadOptions {
                window_max: 1 << 20,
                push_ahead: 0,
                keep_cache: false,
                pin: None,
                order_window: 4096,
            },
            warm: false,
            mountpoint: "/m".into(),
            log: "-".into(),
            threads: 1,
            owner: 0,
            decode: loosefs::decode::DecodeOptions {
                cache_bytes: 1 << 20,
                threads: 1,
                ahead: 1,
                accept_damaged: false,
            },
            passthrough: false,
        };
        let p = loosefs::format::reader::Pack::open(&pack).expect("open");
        let s = Server::local(p, Default::default(), opts).expect("server");
        let dir = s.lookup(1, b".loosefs").unwrap().attr.ino;
        let order = s.lookup(dir, b"order").unwrap().attr.ino;
        let files = (0..64u32)
            .filter_map(|k| {
                let c = s.lookup(1, format!("c{}", k % 4).as_bytes()).ok()?.attr.ino;
                Some(s.lookup(c, format!("f{k}.bin").as_bytes()).ok()?.attr.ino)
            })
            .collect();
        (s, order, files)
    })
}

fn main() {
    afl::fuzz!(|data: &[u8]| {
        let (s, order, files) = server();
        let [size, pid, wrong, rest @ ..] = data else {
            return;
        };
        let size = usize::from(*size) + 1;
        let mut off = 0u64;
        for (k, part) in rest.chunks(size).enumerate() {
            let at = if k == 1 && *wrong == 0xff {
                off + 1
            } else {
                off
            };
            if s.write(*order, at, part, u32::from(*pid)).is_ok() {
                off = at + part.len() as u64;
            }
        }
        for &ino in files.iter().skip(usize::from(*pid) % 8).step_by(3) {
            s.read(ino, 0, 4096, |_| {});
        }
    });
}
