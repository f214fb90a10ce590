//! LeRobot v3 datasets (<https://github.com/huggingface/lerobot>, `codebase_version` v3.x, as
//! lerobot 0.6's `LeRobotDataset` writes them): `meta/info.json` (fps, features: each camera a
//! feature of dtype `video`, the `data_path` and `video_path` templates),
//! `meta/episodes/chunk-*/file-*.parquet` (per episode: `length`, and per camera the video file
//! (`videos/<key>/chunk_index`, `file_index`) and its span from `videos/<key>/from_timestamp`),
//! `data/chunk-*/file-*.parquet` (one row per frame: `episode_index`, `frame_index`,
//! `timestamp` in seconds from the episode's start, and the tabular features).
//!
//! A row's frame of a camera is the one LeRobot's decoders return: the frame of the episode's
//! video file whose timestamp is nearest `from_timestamp + timestamp`, accepted when within the
//! dataset's tolerance (lerobot's default `tolerance_s`, 1e-4 s).

use anyhow::{Context, Result, anyhow, bail};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::{Field, Row};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// LeRobot's default tolerance between a row's timestamp and its frame's, seconds
/// (`LeRobotDataset(tolerance_s=1e-4)`).
pub const TOLERANCE_S: f64 = 1e-4;

/// A numeric column of the data files, per episode a T×D array.
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    /// Feature name (`observation.state`).
    pub name: String,
    /// NumPy type string of its values (`<f4`, `<f8`, `<i8`, `<i4`, `|b1`).
    pub descr: &'static str,
    /// Values per row (D).
    pub width: usize,
}

/// One episode: its rows and where each camera's frames are.
#[derive(Debug, Clone, PartialEq)]
pub struct Episode {
    /// `episode_index`.
    pub index: u64,
    /// Per row, in `frame_index` order: (`frame_index`, `timestamp` in seconds).
    pub rows: Vec<(i64, f64)>,
    /// Per camera (as [`LeRobot::cameras`]): the video file (relative to the root) and the
    /// episode's `from_timestamp` in it, seconds.
    pub videos: Vec<(PathBuf, f64)>,
    /// Per column (as [`LeRobot::columns`]): the values, row after row, little-endian bytes
    /// of the column's type.
    pub values: Vec<Vec<u8>>,
}

/// A LeRobot v3 dataset's metadata, as needed to serve its frames and columns.
#[derive(Debug, Clone, PartialEq)]
pub struct LeRobot {
    /// Frames per second.
    pub fps: f64,
    /// Camera keys (features of dtype `video`), sorted.
    pub cameras: Vec<String>,
    /// Numeric features of the data files, sorted by name.
    pub columns: Vec<Column>,
    /// Episodes by index.
    pub episodes: Vec<Episode>,
}

/// Whether `root` holds a LeRobot v3 dataset (`meta/info.json` with `codebase_version` v3.x).
pub fn detect(root: &Path) -> bool {
    let Ok(b) = std::fs::read(root.join("meta/info.json")) else {
        return false;
    };
    let v: serde_json::Value = serde_json::from_slice(&b).unwrap_or_default();
    v["codebase_version"]
        .as_str()
        .is_some_and(|s| s.starts_with("v3."))
}

/// `template` (Python's `str.format` as lerobot writes its paths:
/// `videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4`) with `values`.
fn fill(template: &str, values: &[(&str, &str, u64)]) -> Result<String> {
    let mut out = String::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = rest[open..]
            .find('}')
            .ok_or_else(|| anyhow!("{template}: an unclosed '{{'"))?
            + open;
        let field = &rest[open + 1..close];
        let (key, spec) = field.split_once(':').unwrap_or((field, ""));
        match values.iter().find(|(k, _, _)| *k == key) {
            Some((_, s, _)) if !s.is_empty() => out.push_str(s),
            Some((_, _, n)) => {
                let width: usize = (spec.strip_prefix('0').and_then(|w| w.strip_suffix('d')))
                    .map_or(Ok(0), str::parse)
                    .with_context(|| format!("{template}: format {spec:?}"))?;
                out.push_str(&format!("{n:0width$}"));
            }
            None => bail!("{template}: no value for {{{key}}}"),
        }
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Whether `name` can be one path component: not empty, `.` or `..`, no `/`, `\\` or
/// control character.
fn plain_name(name: &str) -> bool {
    !matches!(name, "" | "." | "..")
        && !name
            .chars()
            .any(|c| c == '/' || c == '\\' || c.is_control())
}

/// `rel` (a path filled from `info`'s `video_path`) as a path below the dataset's root: only
/// plain names, neither absolute nor climbing out with `..` — a dataset's metadata never
/// makes the mount read a file outside its tree (nor, under a remote prefix, a local one).
/// Errors: another path, naming `info` and the path.
fn relative_below(info: &Path, rel: &str) -> Result<PathBuf> {
    let p = PathBuf::from(rel);
    let ok = !rel.is_empty()
        && p.components().all(|c| match c {
            std::path::Component::Normal(n) => n.to_str().is_some_and(plain_name),
            _ => false,
        });
    if !ok {
        bail!(
            "{}: video_path gives {rel:?}, not a relative path below the dataset (no absolute \
             path, no '.' or '..')",
            info.display()
        );
    }
    Ok(p)
}

/// The Parquet files `dir/chunk-*/file-*.parquet` under `root`, sorted.
fn parquet_files(root: &Path, dir: &str) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let d = root.join(dir);
    for chunk in std::fs::read_dir(&d).with_context(|| format!("cannot list {}", d.display()))? {
        let chunk = chunk?.path();
        if !chunk.is_dir() {
            continue;
        }
        for f in std::fs::read_dir(&chunk)? {
            let f = f?.path();
            if f.extension().is_some_and(|e| e == "parquet") {
                out.push(f);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Every row of the Parquet file `path`.
fn rows(path: &Path) -> Result<Vec<Row>> {
    let f = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let r = SerializedFileReader::new(f)
        .with_context(|| format!("{}: not a Parquet file", path.display()))?;
    (r.get_row_iter(None)?)
        .map(|r| r.with_context(|| format!("{}: a damaged row", path.display())))
        .collect()
}

/// The field `name` of `row`.
fn field<'a>(row: &'a Row, name: &str) -> Option<&'a Field> {
    row.get_column_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, f)| f)
}

fn as_f64(f: &Field) -> Option<f64> {
    match f {
        Field::Float(x) => Some(f64::from(*x)),
        Field::Double(x) => Some(*x),
        Field::Int(x) => Some(f64::from(*x)),
        Field::Long(x) => Some(*x as f64),
        _ => None,
    }
}

fn as_i64(f: &Field) -> Option<i64> {
    match f {
        Field::Int(x) => Some(i64::from(*x)),
        Field::Long(x) => Some(*x),
        _ => None,
    }
}

/// Appends `f` (a scalar or a list of them) as `descr`'s little-endian values; the count.
fn push_values(f: &Field, descr: &str, out: &mut Vec<u8>) -> Option<usize> {
    let one = |f: &Field, out: &mut Vec<u8>| -> Option<()> {
        match (descr, f) {
            ("<f4", Field::Float(x)) => out.extend_from_slice(&x.to_le_bytes()),
            ("<f8", Field::Double(x)) => out.extend_from_slice(&x.to_le_bytes()),
            ("<i8", Field::Long(x)) => out.extend_from_slice(&x.to_le_bytes()),
            ("<i4", Field::Int(x)) => out.extend_from_slice(&x.to_le_bytes()),
            ("|b1", Field::Bool(x)) => out.push(u8::from(*x)),
            _ => return None,
        }
        Some(())
    };
    match f {
        Field::ListInternal(l) => {
            for e in l.elements() {
                one(e, out)?;
            }
            Some(l.elements().len())
        }
        f => one(f, out).map(|_| 1),
    }
}

/// `meta/info.json`, the fields loosefs reads (LeRobot v3's `LeRobotDatasetMetadata.info`):
/// frames per second, the template of a video file's path, and each feature's dtype and shape.
#[derive(serde::Deserialize)]
struct Info {
    fps: f64,
    video_path: String,
    features: BTreeMap<String, Feature>,
}

/// One feature of `info.json`: `video` for a camera, else a numeric dtype and its shape.
#[derive(serde::Deserialize)]
struct Feature {
    dtype: String,
    #[serde(default)]
    shape: Vec<usize>,
}

/// The `.npy` descr of a numeric LeRobot dtype; `None` for dtypes not served as columns
/// (strings, images).
fn descr_of(dtype: &str) -> Option<&'static str> {
    Some(match dtype {
        "float32" => "<f4",
        "float64" => "<f8",
        "int64" => "<i8",
        "int32" => "<i4",
        "bool" => "|b1",
        _ => return None,
    })
}

/// What `meta/info.json` says: fps, the video path template, the cameras (sorted) and the
/// numeric columns (sorted by name). Errors: missing or not JSON, a field missing or of
/// another type, fps not positive, a camera key that is not a plain name (it is filled into
/// a path).
fn read_info(info_path: &Path) -> Result<(f64, String, Vec<String>, Vec<Column>)> {
    let bytes =
        std::fs::read(info_path).with_context(|| format!("cannot read {}", info_path.display()))?;
    let info: Info = serde_json::from_slice(&bytes)
        .with_context(|| format!("{}: not LeRobot's info.json", info_path.display()))?;
    if info.fps.is_nan() || info.fps <= 0.0 {
        bail!("{}: fps {} is not positive", info_path.display(), info.fps);
    }
    let mut cameras = Vec::new();
    let mut columns = Vec::new();
    for (name, f) in info.features {
        if f.dtype == "video" {
            if !plain_name(&name) {
                bail!(
                    "{}: the camera key {name:?} is not a plain name (it is filled into \
                     video_path: no '/', '.', '..' or control characters)",
                    info_path.display()
                );
            }
            cameras.push(name);
        } else if let Some(descr) = descr_of(&f.dtype) {
            let width = f.shape.iter().product::<usize>().max(1);
            columns.push(Column { name, descr, width });
        }
    }
    cameras.sort();
    columns.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((info.fps, info.video_path, cameras, columns))
}

/// The episodes `meta/episodes/` lists (their rows empty yet) and the length each says, with
/// each camera's video file (from `video_path`) and the timestamp its episode starts at.
/// Errors: a Parquet file that cannot be read, a column missing or of another type, a video
/// path outside the dataset.
fn read_episodes(
    root: &Path,
    info_path: &Path,
    video_path: &str,
    cameras: &[String],
    columns: usize,
) -> Result<(BTreeMap<u64, Episode>, BTreeMap<u64, i64>)> {
    let mut episodes = BTreeMap::new();
    let mut lengths = BTreeMap::new();
    for path in parquet_files(root, "meta/episodes")? {
        let name = path.display().to_string();
        for row in rows(&path)? {
            let get = |c: &str| field(&row, c).ok_or_else(|| anyhow!("{name}: no column {c}"));
            let index = as_i64(get("episode_index")?)
                .ok_or_else(|| anyhow!("{name}: episode_index is not an integer"))?
                as u64;
            lengths.insert(index, as_i64(get("length")?).unwrap_or(0));
            let mut videos = Vec::new();
            for cam in cameras {
                let int = |c: &str| -> Result<u64> {
                    let c = format!("videos/{cam}/{c}");
                    as_i64(get(&c)?)
                        .map(|n| n as u64)
                        .ok_or_else(|| anyhow!("{name}: {c} is not an integer"))
                };
                let (chunk, file) = (int("chunk_index")?, int("file_index")?);
                let from = as_f64(get(&format!("videos/{cam}/from_timestamp"))?)
                    .ok_or_else(|| anyhow!("{name}: from_timestamp is not a number"))?;
                let rel = fill(
                    video_path,
                    &[
                        ("video_key", cam, 0),
                        ("chunk_index", "", chunk),
                        ("file_index", "", file),
                    ],
                )?;
                videos.push((relative_below(info_path, &rel)?, from));
            }
            let values = vec![Vec::new(); columns];
            let rows = Vec::new();
            episodes.insert(
                index,
                Episode {
                    index,
                    rows,
                    videos,
                    values,
                },
            );
        }
    }
    Ok((episodes, lengths))
}

/// Adds the rows of the data files (`data/`) to their `episodes`: each row's frame index and
/// timestamp, and its values of every column. Errors: a Parquet file that cannot be read, a
/// column missing or not of its width and type, a row of an episode not listed.
fn read_rows(root: &Path, columns: &[Column], episodes: &mut BTreeMap<u64, Episode>) -> Result<()> {
    for path in parquet_files(root, "data")? {
        let name = path.display().to_string();
        let mut found: Vec<(u64, i64, f64, Vec<Vec<u8>>)> = Vec::new();
        for row in rows(&path)? {
            let get = |c: &str| field(&row, c).ok_or_else(|| anyhow!("{name}: no column {c}"));
            let ep = as_i64(get("episode_index")?).unwrap_or(-1);
            let fi = as_i64(get("frame_index")?)
                .ok_or_else(|| anyhow!("{name}: frame_index is not an integer"))?;
            let ts = as_f64(get("timestamp")?)
                .ok_or_else(|| anyhow!("{name}: timestamp is not a number"))?;
            let mut vals = Vec::with_capacity(columns.len());
            for c in columns {
                let mut b = Vec::new();
                let n = push_values(get(&c.name)?, c.descr, &mut b);
                if n != Some(c.width) {
                    bail!(
                        "{name}: {} holds no {} values of type {}",
                        c.name,
                        c.width,
                        c.descr
                    );
                }
                vals.push(b);
            }
            found.push((ep as u64, fi, ts, vals));
        }
        for (ep, fi, ts, vals) in found {
            let e = episodes.get_mut(&ep).ok_or_else(|| {
                anyhow!("{name}: a row of episode {ep}, which meta/episodes does not list")
            })?;
            e.rows.push((fi, ts));
            for (i, v) in vals.into_iter().enumerate() {
                e.values[i].extend_from_slice(&v);
            }
        }
    }
    Ok(())
}

/// Checks that each episode has the rows its metadata counts, frame indexes 0..length in
/// order. Errors: name the episode and what differs.
fn check_rows(root: &Path, episodes: &[Episode], lengths: &BTreeMap<u64, i64>) -> Result<()> {
    for e in episodes {
        let want = lengths.get(&e.index).copied().unwrap_or(0);
        if e.rows.len() as i64 != want {
            bail!(
                "{}: episode {} has {} rows in data/, {want} in meta/episodes",
                root.display(),
                e.index,
                e.rows.len()
            );
        }
        let mut seen: Vec<i64> = e.rows.iter().map(|r| r.0).collect();
        seen.sort();
        if seen != (0..want).collect::<Vec<_>>() || e.rows.windows(2).any(|w| w[0].0 > w[1].0) {
            bail!(
                "{}: episode {}'s rows are not frame_index 0..{want} in order",
                root.display(),
                e.index
            );
        }
    }
    Ok(())
}

impl LeRobot {
    /// Reads the dataset at `root`: its info (`meta/info.json`, typed), its episodes' metadata and its
    /// data files' rows, then checks every episode's rows against its length.
    ///
    /// Errors: a file missing or damaged, a column missing, an episode's rows not those its
    /// metadata counts (each message names the file).
    pub fn open(root: &Path) -> Result<LeRobot> {
        let info_path = root.join("meta/info.json");
        let (fps, video_path, cameras, columns) = read_info(&info_path)?;
        let (mut episodes, lengths) =
            read_episodes(root, &info_path, &video_path, &cameras, columns.len())?;
        read_rows(root, &columns, &mut episodes)?;
        let episodes: Vec<Episode> = episodes.into_values().collect();
        check_rows(root, &episodes, &lengths)?;
        Ok(LeRobot {
            fps,
            cameras,
            columns,
            episodes,
        })
    }
}

/// A `.npy` file (format 1.0, as `np.save` writes it) of `rows` × `width` values of `descr`
/// whose little-endian bytes are `data`.
pub fn npy(descr: &str, rows: usize, width: usize, data: &[u8]) -> Vec<u8> {
    let mut h = crate::view::npy_header(descr, &format!("({rows}, {width})"));
    h.extend_from_slice(data);
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn video_paths_and_camera_keys_that_leave_the_tree_are_refused() {
        let info = Path::new("/d/meta/info.json");
        let ok = relative_below(info, "videos/cam/chunk-000/file-000.mp4").unwrap();
        assert_eq!(ok, PathBuf::from("videos/cam/chunk-000/file-000.mp4"));
        for bad in [
            "/etc/x.mp4",
            "../x.mp4",
            "videos/../../x.mp4",
            "",
            "videos/\u{1}/x.mp4",
        ] {
            let e = relative_below(info, bad).unwrap_err().to_string();
            assert!(
                e.contains("info.json") && e.contains("video_path"),
                "{bad}: {e}"
            );
        }
        assert!(plain_name("observation.images.front"));
        for bad in ["", ".", "..", "a/b", "a\\b", "a\nb"] {
            assert!(!plain_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn lerobot_path_templates_fill_as_python_formats_them() {
        let t = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4";
        let v = [
            ("video_key", "cam.top", 0),
            ("chunk_index", "", 1),
            ("file_index", "", 12),
        ];
        assert_eq!(
            fill(t, &v).unwrap(),
            "videos/cam.top/chunk-001/file-012.mp4"
        );
        assert!(fill("x/{nope}.mp4", &v).is_err());
        assert!(fill("x/{chunk_index", &v).is_err());
    }

    #[test]
    fn the_shared_dataset_reads_as_its_writer_wrote_it() {
        let Some(root) = crate::testutil::data_root()
            .map(|d| d.join("lerobot/so100-av1"))
            .filter(|r| r.is_dir())
        else {
            return crate::testutil::missing_prerequisite(
                "lerobot/so100-av1 in ../shared/data or the corpus (scripts/make-test-data.py --lerobot)",
            );
        };
        assert!(detect(&root));
        let d = LeRobot::open(&root).unwrap();
        assert_eq!(d.fps, 30.0);
        assert_eq!(
            d.cameras,
            ["observation.images.top", "observation.images.wrist"]
        );
        assert_eq!(d.episodes.len(), 4);
        let e = &d.episodes[1];
        assert_eq!(e.rows.len(), 60);
        assert_eq!(e.rows[0], (0, 0.0));
        assert_eq!(e.videos[0].1, 2.0);
        let state = d
            .columns
            .iter()
            .position(|c| c.name == "observation.state")
            .unwrap();
        assert_eq!(d.columns[state].width, 6);
        assert_eq!(e.values[state].len(), 60 * 6 * 4);
    }
}
