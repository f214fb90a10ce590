"""The command line's options, by command, as keywords of the Python API: written by
scripts/gen-python-options from `loosefs COMMAND --help`; do not edit (regenerate).

Each: (keyword, value name or None for a flag, default or None, choices or None, help).
"""

import os
from typing import Literal, Sequence, TypedDict, Union


OPTIONS = {
    'mount': (
        ('format', 'FORMAT', None, None, 'Read the source as this format instead of detecting it: tar (webdataset), zip, tfrecord, mds, litdata, gulpio, ffcv, parquet (hf-parquet)'),
        ('class_names', 'CLASS_NAMES', None, None, "Class directory names, one per line: line i names the i-th smallest label (overrides the format's own names)"),
        ('label', 'LABEL', None, None, "The field holding the label, instead of the format's usual one: a WebDataset member extension (default cls), a TFRecord int64 feature (default image/class/label), an MDS integer column or a Parquet column (default: its ClassLabel)"),
        ('fields', 'FIELDS', 'image', ('image', 'all'), 'Which fields of each sample are files: `image` (default: one file per sample, what ImageFolder expects) or `all` (every other field stored in place too, as `<stem>.<field>` beside the image, e.g. `<key>.cls`, `<key>.txt` for WebDataset)'),
        ('verify', 'VERIFY', 'lazy', ('lazy', 'full'), "How a foreign dataset is checked: `lazy` (default) indexes it reading each sample's head only (the JPEG header) and checks each sample against its format's checksum, or else against the CRC-32 of its first read, on every read; `full` reads every sample once at indexing (a CRC-32 each) before the mount serves any"),
        ('index', 'SHARED_INDEX', None, None, "A shared index of the dataset written by `loosefs index` (default: `<SRC>.loosefs-index` beside the dataset, used when it exists and fits this mount's options; for a bucket prefix of loose objects, its listing): a stale one is refused, naming the file that changed"),
        ('refresh', None, None, None, "A stale shared listing of loose objects (objects added, removed or replaced since `loosefs index`) is replaced: the prefix listed again and the listing rewritten in its place (over HTTPS: the server's listing served instead)"),
        ('index_dir', 'INDEX_DIR', None, None, 'Where the index of a foreign source is kept (default: `index/` under $LOOSEFS_CACHE_DIR, else $XDG_CACHE_HOME/loosefs, else ~/.cache/loosefs)'),
        ('chunk_cache', 'CHUNK_CACHE', '1G', None, 'Memory for decompressed chunks of a compressed source (zstd MDS shards and LitData chunks, deflated zip members), e.g. 2G; the least recently used chunk goes first'),
        ('pin', 'PIN', None, None, 'Keep this much of the pack resident (mlock), from its start: a size such as 2G or 512M, or `all`'),
        ('warm', None, None, None, 'Stream the whole pack into the page cache in the background after mounting'),
        ('wait', None, None, None, 'Return only once `--pin` and `--warm` are complete, showing their progress (without it they proceed in the background and `loosefs stats` shows how far they are)'),
        ('keep_pack_cache', None, None, None, "Keep a sample's pack pages cached after serving it"),
        ('endpoint_url', 'ENDPOINT_URL', None, None, "Endpoint of the store instead of the cloud's own: an S3-compatible server, e.g. http://127.0.0.1:8333 (default: $AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, the profile's endpoint_url, else AWS), a GCS emulator (default: $STORAGE_EMULATOR_HOST), an Azure blob endpoint with its account, e.g. http://127.0.0.1:10000/devstoreaccount1 (default: the connection string's BlobEndpoint)"),
        ('region', 'REGION', None, None, "S3 region to sign for first (default: $AWS_REGION, the profile's region, else us-east-1); a bucket elsewhere is followed to its own region, as the server names it"),
        ('request_payer', None, None, None, 'S3 Requester Pays: the requests say the requester pays for them (`x-amz-request-payer: requester`, as `aws s3 --request-payer requester`); a Requester Pays bucket refuses requests without it (403)'),
        ('billing_project', 'PROJECT', None, None, "GCS Requester Pays: the Google Cloud project billed for the requests (`x-goog-user-project`, as `gcloud storage --billing-project` and gsutil's `-u`)"),
        ('no_sign_request', None, None, None, 'Send unsigned requests (public buckets and containers); no credentials are looked up'),
        ('profile', 'PROFILE', None, None, 'Profile of the shared AWS files to take credentials and region from (default: $AWS_PROFILE, else `default`)'),
        ('allow_http', None, None, None, 'Allow plain `http://` URLs and endpoints (bytes unencrypted on the wire)'),
        ('ca_bundle', 'CA_BUNDLE', None, None, 'PEM file of extra CA certificates to trust for https (default: $AWS_CA_BUNDLE)'),
        ('cache_dir', 'CACHE_DIR', None, None, 'Local block cache of remote packs: blocks fetched are kept here across mounts of the same object (keyed by URL and ETag) (default: `blocks/` under $LOOSEFS_CACHE_DIR, else $XDG_CACHE_HOME/loosefs, else ~/.cache/loosefs)'),
        ('cache_size', 'CACHE_SIZE', None, None, "Most bytes the cache directory holds, e.g. 20G: this pack's blocks (at most its size) and other packs' (removed least recently used first) (default: what it holds now plus the free space of its file system, less 5% of that file system's size)"),
        ('max_requests', 'MAX_REQUESTS', '16', None, 'Concurrent GETs of 1 MiB or more at most; smaller GETs count for less, down to 1/8 for 128 KiB or less (so up to 8× as many small objects are fetched at once)'),
        ('retries', 'RETRIES', '1000', None, 'Most retries of a failed GET (5xx, SlowDown, reset, refused, timeout), with jittered exponential backoff from 100 ms up to 15 s, before the read answers EIO; the default is as many as fit in --retry-timeout, so an outage shorter than it fails no read'),
        ('retry_timeout', 'RETRY_TIMEOUT', '120', None, 'Longest time spent retrying one GET, seconds'),
        ('request_timeout', 'REQUEST_TIMEOUT', '60', None, 'Time limit of one GET, seconds'),
        ('offline', None, None, None, 'Mount without reaching the server: from a complete block cache of the URL (every block of the samples and the index kept, closed cleanly by an earlier mount), at the ETag recorded there'),
        ('decode', 'DECODE', None, ('npy', 'ppm', 'frames'), "Serve decoded views of every JPEG (`npy`, `ppm`, or both: `--decode npy,ppm`) and the frames of a LeRobot dataset's videos (`frames`)"),
        ('decoded_only', None, None, None, 'With `--decode npy`: list only the `.npy` views, not the JPEGs'),
        ('decode_max_side', 'N', None, None, 'Decode at the smallest DCT scale (1/2, 1/4, 1/8) whose longer side is still ≥ N pixels'),
        ('decode_cache', 'SIZE', '1G; for video frames, half the memory available, at least 256M', None, 'Budget of the decoded cache (bytes of pixels, least recently used evicted), e.g. 2G'),
        ('decode_threads', 'N', None, None, 'Decode threads (default: one per core)'),
        ('decode_ahead', 'N', '8', None, 'JPEGs decoded ahead of a reader that walks the pack in order (0 disables)'),
        ('decode_accept_damaged', None, None, None, 'Serve what libjpeg recovers from truncated or corrupt JPEGs (grey where data is missing), as Pillow does with `ImageFile.LOAD_TRUNCATED_IMAGES = True`'),
        ('keeper', None, None, None, 'Keep the mount across daemon deaths: a small keeper process holds the FUSE connection and starts a new daemon when one dies (a crash, the OOM killer) or on `loosefs restart`; readers see a pause, not an error'),
        ('resend', None, None, None, 'Have the kernel resend the requests a dead daemon had read but not answered (FUSE_NOTIFY_RESEND, Linux 6.9+), so a kept mount loses no read'),
        ('threads', 'THREADS', '16', None, 'FUSE worker threads'),
        ('log', 'LOG', None, None, 'Log file of the background daemon (default: `~/.local/state/loosefs/log/<mountpoint>.log`, or under `$XDG_STATE_HOME`; `loosefs stats` names it)'),
        ('env_file', 'FILE', None, None, "Take store settings and credentials from FILE (`NAME=VALUE` lines; only the stores' variables, `AWS_*`, `GOOGLE_*`, `GCE_METADATA_*`, `AZURE_*`, `STORAGE_EMULATOR_HOST`, and `LOOSEFS_*`), as a site gives them to a job's daemon without a command line or a log holding them: the Slurm prolog hands its root-owned file as `/dev/fd/4`"),
        ('debug', None, None, None, "Log loosefs's debug messages too (each failed request with its path and error, each remote GET with its range and time): the same as `RUST_LOG=loosefs=debug`, into the log file"),
        ('progress_lines', None, None, None, 'Progress for programs that wrap `loosefs mount` (the Python package\'s tqdm bars): the first mount\'s indexing and walk, and `--wait`\'s pin and warm, as JSON lines on stderr instead of the terminal\'s bars, `{"progress": {"step": "index", "unit": "samples", "done": N, "total": N}}` at most five a second per step, and `{"note": "..."}` for what a terminal shows as `loosefs: ...`'),
        ('allow_other', None, None, None, 'Let every local user read the mount (FUSE `allow_other`; a non-root user needs `user_allow_other` in /etc/fuse.conf)'),
        ('allow_non_empty', None, None, None, 'Mount over a directory that holds files (they are hidden while mounted)'),
        ('passthrough', 'PASSTHROUGH', 'off', ('on', 'off'), "How a loose directory's files reach readers: `off` (default) the daemon reads them and the kernel keeps them in the mount's page cache (warm reads need no round trip at all); `on` the kernel reads the original files itself (FUSE passthrough: no READ, no second copy in memory, but an OPEN and a RELEASE round trip per open file, so many small files read slower than with `off`) where the kernel and privileges allow it, else the daemon"),
        ('transport', 'TRANSPORT', 'auto', ('auto', 'uring', 'classic'), 'How requests reach the daemon: `uring` (FUSE over io_uring, Linux 6.14+: a reply and the wait for the next request in one system call, per-CPU queues), `classic` (`/dev/fuse`), `auto` (uring where the kernel offers it; passthrough needs classic)'),
        ('metrics_addr', 'ADDR', None, None, "Serve the mount's statistics over HTTP at ADDR (HOST:PORT, e.g. `localhost:9464` or `127.0.0.1:9464`; port 0 picks a free one, said when the mount is ready) for a Prometheus server to scrape: `GET /metrics` answers what `stats --format prometheus` prints (OpenMetrics when the scrape asks for it)"),
        ('read_ahead_kb', 'READ_AHEAD_KB', '0', None, "Kernel read-ahead for this mount, KiB (0 keeps the kernel's default, 128)"),
        ('prefetch_max_mb', 'PREFETCH_MAX_MB', '64', None, 'Largest read-ahead window in pack order, MiB (0 disables read-ahead across samples)'),
        ('order_window_mb', 'ORDER_WINDOW_MB', '256', None, 'Largest read-ahead window along an announced epoch order (`<mnt>/.loosefs/order`): bytes read ahead and not yet served, MiB (0: orders are counted, not read ahead)'),
        ('push_ahead', 'PUSH_AHEAD', '64', None, "While a reader walks the pack in order, push this many following samples into the kernel's page cache ahead of it (FUSE_NOTIFY_STORE), so their reads need no round trip to the daemon; a reader following an announced order is pushed the samples the order read ahead (up to 256 MiB past its last READ) whatever this number"),
    ),
    'pack': (
        ('jobs', 'JOBS', '0', None, 'Reader threads (default: number of CPUs)'),
        ('align', 'ALIGN', '512', None, "Alignment of each sample's data in bytes: a power of two from 1 to 32768"),
        ('follow_links', None, None, None, 'Follow symbolic links (default: report and skip them)'),
        ('force', None, None, None, 'Replace OUT if it exists'),
        ('progress_lines', None, None, None, 'Progress for programs that wrap `loosefs pack` (the Python package\'s tqdm bar): one JSON object per line on stderr, at most five a second per step and one at its end, `{"progress": {"step": "pack", "unit": "bytes", "done": N, "total": N, "files": N}}` (sample bytes written, of all; a directory\'s walk comes first as step `walk`)'),
        ('format', 'FORMAT', None, None, 'Read the source as this format instead of detecting it: tar (webdataset), zip, tfrecord, mds, litdata, gulpio, ffcv, parquet (hf-parquet)'),
        ('class_names', 'CLASS_NAMES', None, None, "Class directory names, one per line: line i names the i-th smallest label (overrides the format's own names)"),
        ('label', 'LABEL', None, None, "The field holding the label, instead of the format's usual one: a WebDataset member extension (default cls), a TFRecord int64 feature (default image/class/label), an MDS integer column or a Parquet column (default: its ClassLabel)"),
        ('fields', 'FIELDS', 'image', ('image', 'all'), 'Which fields of each sample are files: `image` (default: one file per sample, what ImageFolder expects) or `all` (every other field stored in place too, as `<stem>.<field>` beside the image, e.g. `<key>.cls`, `<key>.txt` for WebDataset)'),
        ('verify', 'VERIFY', 'lazy', ('lazy', 'full'), "How a foreign dataset is checked: `lazy` (default) indexes it reading each sample's head only (the JPEG header) and checks each sample against its format's checksum, or else against the CRC-32 of its first read, on every read; `full` reads every sample once at indexing (a CRC-32 each) before the mount serves any"),
        ('index', 'SHARED_INDEX', None, None, "A shared index of the dataset written by `loosefs index` (default: `<SRC>.loosefs-index` beside the dataset, used when it exists and fits this mount's options; for a bucket prefix of loose objects, its listing): a stale one is refused, naming the file that changed"),
        ('refresh', None, None, None, "A stale shared listing of loose objects (objects added, removed or replaced since `loosefs index`) is replaced: the prefix listed again and the listing rewritten in its place (over HTTPS: the server's listing served instead)"),
        ('index_dir', 'INDEX_DIR', None, None, 'Where the index of a foreign source is kept (default: `index/` under $LOOSEFS_CACHE_DIR, else $XDG_CACHE_HOME/loosefs, else ~/.cache/loosefs)'),
        ('chunk_cache', 'CHUNK_CACHE', '1G', None, 'Memory for decompressed chunks of a compressed source (zstd MDS shards and LitData chunks, deflated zip members), e.g. 2G; the least recently used chunk goes first'),
        ('endpoint_url', 'ENDPOINT_URL', None, None, "Endpoint of the store instead of the cloud's own: an S3-compatible server, e.g. http://127.0.0.1:8333 (default: $AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, the profile's endpoint_url, else AWS), a GCS emulator (default: $STORAGE_EMULATOR_HOST), an Azure blob endpoint with its account, e.g. http://127.0.0.1:10000/devstoreaccount1 (default: the connection string's BlobEndpoint)"),
        ('region', 'REGION', None, None, "S3 region to sign for first (default: $AWS_REGION, the profile's region, else us-east-1); a bucket elsewhere is followed to its own region, as the server names it"),
        ('request_payer', None, None, None, 'S3 Requester Pays: the requests say the requester pays for them (`x-amz-request-payer: requester`, as `aws s3 --request-payer requester`); a Requester Pays bucket refuses requests without it (403)'),
        ('billing_project', 'PROJECT', None, None, "GCS Requester Pays: the Google Cloud project billed for the requests (`x-goog-user-project`, as `gcloud storage --billing-project` and gsutil's `-u`)"),
        ('no_sign_request', None, None, None, 'Send unsigned requests (public buckets and containers); no credentials are looked up'),
        ('profile', 'PROFILE', None, None, 'Profile of the shared AWS files to take credentials and region from (default: $AWS_PROFILE, else `default`)'),
        ('allow_http', None, None, None, 'Allow plain `http://` URLs and endpoints (bytes unencrypted on the wire)'),
        ('ca_bundle', 'CA_BUNDLE', None, None, 'PEM file of extra CA certificates to trust for https (default: $AWS_CA_BUNDLE)'),
        ('cache_dir', 'CACHE_DIR', None, None, 'Local block cache of remote packs: blocks fetched are kept here across mounts of the same object (keyed by URL and ETag) (default: `blocks/` under $LOOSEFS_CACHE_DIR, else $XDG_CACHE_HOME/loosefs, else ~/.cache/loosefs)'),
        ('cache_size', 'CACHE_SIZE', None, None, "Most bytes the cache directory holds, e.g. 20G: this pack's blocks (at most its size) and other packs' (removed least recently used first) (default: what it holds now plus the free space of its file system, less 5% of that file system's size)"),
        ('max_requests', 'MAX_REQUESTS', '16', None, 'Concurrent GETs of 1 MiB or more at most; smaller GETs count for less, down to 1/8 for 128 KiB or less (so up to 8× as many small objects are fetched at once)'),
        ('retries', 'RETRIES', '1000', None, 'Most retries of a failed GET (5xx, SlowDown, reset, refused, timeout), with jittered exponential backoff from 100 ms up to 15 s, before the read answers EIO; the default is as many as fit in --retry-timeout, so an outage shorter than it fails no read'),
        ('retry_timeout', 'RETRY_TIMEOUT', '120', None, 'Longest time spent retrying one GET, seconds'),
        ('request_timeout', 'REQUEST_TIMEOUT', '60', None, 'Time limit of one GET, seconds'),
        ('offline', None, None, None, 'Mount without reaching the server: from a complete block cache of the URL (every block of the samples and the index kept, closed cleanly by an earlier mount), at the ETag recorded there'),
    ),
    'info': (
        ('format', 'FORMAT', None, None, 'Read the source as this format instead of detecting it: tar (webdataset), zip, tfrecord, mds, litdata, gulpio, ffcv, parquet (hf-parquet)'),
        ('class_names', 'CLASS_NAMES', None, None, "Class directory names, one per line: line i names the i-th smallest label (overrides the format's own names)"),
        ('label', 'LABEL', None, None, "The field holding the label, instead of the format's usual one: a WebDataset member extension (default cls), a TFRecord int64 feature (default image/class/label), an MDS integer column or a Parquet column (default: its ClassLabel)"),
        ('fields', 'FIELDS', 'image', ('image', 'all'), 'Which fields of each sample are files: `image` (default: one file per sample, what ImageFolder expects) or `all` (every other field stored in place too, as `<stem>.<field>` beside the image, e.g. `<key>.cls`, `<key>.txt` for WebDataset)'),
        ('verify', 'VERIFY', 'lazy', ('lazy', 'full'), "How a foreign dataset is checked: `lazy` (default) indexes it reading each sample's head only (the JPEG header) and checks each sample against its format's checksum, or else against the CRC-32 of its first read, on every read; `full` reads every sample once at indexing (a CRC-32 each) before the mount serves any"),
        ('index', 'SHARED_INDEX', None, None, "A shared index of the dataset written by `loosefs index` (default: `<SRC>.loosefs-index` beside the dataset, used when it exists and fits this mount's options; for a bucket prefix of loose objects, its listing): a stale one is refused, naming the file that changed"),
        ('refresh', None, None, None, "A stale shared listing of loose objects (objects added, removed or replaced since `loosefs index`) is replaced: the prefix listed again and the listing rewritten in its place (over HTTPS: the server's listing served instead)"),
        ('index_dir', 'INDEX_DIR', None, None, 'Where the index of a foreign source is kept (default: `index/` under $LOOSEFS_CACHE_DIR, else $XDG_CACHE_HOME/loosefs, else ~/.cache/loosefs)'),
        ('chunk_cache', 'CHUNK_CACHE', '1G', None, 'Memory for decompressed chunks of a compressed source (zstd MDS shards and LitData chunks, deflated zip members), e.g. 2G; the least recently used chunk goes first'),
        ('endpoint_url', 'ENDPOINT_URL', None, None, "Endpoint of the store instead of the cloud's own: an S3-compatible server, e.g. http://127.0.0.1:8333 (default: $AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, the profile's endpoint_url, else AWS), a GCS emulator (default: $STORAGE_EMULATOR_HOST), an Azure blob endpoint with its account, e.g. http://127.0.0.1:10000/devstoreaccount1 (default: the connection string's BlobEndpoint)"),
        ('region', 'REGION', None, None, "S3 region to sign for first (default: $AWS_REGION, the profile's region, else us-east-1); a bucket elsewhere is followed to its own region, as the server names it"),
        ('request_payer', None, None, None, 'S3 Requester Pays: the requests say the requester pays for them (`x-amz-request-payer: requester`, as `aws s3 --request-payer requester`); a Requester Pays bucket refuses requests without it (403)'),
        ('billing_project', 'PROJECT', None, None, "GCS Requester Pays: the Google Cloud project billed for the requests (`x-goog-user-project`, as `gcloud storage --billing-project` and gsutil's `-u`)"),
        ('no_sign_request', None, None, None, 'Send unsigned requests (public buckets and containers); no credentials are looked up'),
        ('profile', 'PROFILE', None, None, 'Profile of the shared AWS files to take credentials and region from (default: $AWS_PROFILE, else `default`)'),
        ('allow_http', None, None, None, 'Allow plain `http://` URLs and endpoints (bytes unencrypted on the wire)'),
        ('ca_bundle', 'CA_BUNDLE', None, None, 'PEM file of extra CA certificates to trust for https (default: $AWS_CA_BUNDLE)'),
        ('cache_dir', 'CACHE_DIR', None, None, 'Local block cache of remote packs: blocks fetched are kept here across mounts of the same object (keyed by URL and ETag) (default: `blocks/` under $LOOSEFS_CACHE_DIR, else $XDG_CACHE_HOME/loosefs, else ~/.cache/loosefs)'),
        ('cache_size', 'CACHE_SIZE', None, None, "Most bytes the cache directory holds, e.g. 20G: this pack's blocks (at most its size) and other packs' (removed least recently used first) (default: what it holds now plus the free space of its file system, less 5% of that file system's size)"),
        ('max_requests', 'MAX_REQUESTS', '16', None, 'Concurrent GETs of 1 MiB or more at most; smaller GETs count for less, down to 1/8 for 128 KiB or less (so up to 8× as many small objects are fetched at once)'),
        ('retries', 'RETRIES', '1000', None, 'Most retries of a failed GET (5xx, SlowDown, reset, refused, timeout), with jittered exponential backoff from 100 ms up to 15 s, before the read answers EIO; the default is as many as fit in --retry-timeout, so an outage shorter than it fails no read'),
        ('retry_timeout', 'RETRY_TIMEOUT', '120', None, 'Longest time spent retrying one GET, seconds'),
        ('request_timeout', 'REQUEST_TIMEOUT', '60', None, 'Time limit of one GET, seconds'),
        ('offline', None, None, None, 'Mount without reaching the server: from a complete block cache of the URL (every block of the samples and the index kept, closed cleanly by an earlier mount), at the ETag recorded there'),
    ),
    'index': (
        ('progress_lines', None, None, None, 'Progress for programs that wrap `loosefs index` (the Python package\'s tqdm bars): one JSON object per line on stderr instead of the terminal\'s bars, at most five a second per step, `{"progress": {"step": "index", "unit": "samples", "done": N, "total": N}}`, and `{"note": "..."}` for what a terminal shows as `loosefs: ...`'),
        ('format', 'FORMAT', None, None, 'Read the source as this format instead of detecting it: tar (webdataset), zip, tfrecord, mds, litdata, gulpio, ffcv, parquet (hf-parquet)'),
        ('class_names', 'CLASS_NAMES', None, None, "Class directory names, one per line: line i names the i-th smallest label (overrides the format's own names)"),
        ('label', 'LABEL', None, None, "The field holding the label, instead of the format's usual one: a WebDataset member extension (default cls), a TFRecord int64 feature (default image/class/label), an MDS integer column or a Parquet column (default: its ClassLabel)"),
        ('fields', 'FIELDS', 'image', ('image', 'all'), 'Which fields of each sample are files: `image` (default: one file per sample, what ImageFolder expects) or `all` (every other field stored in place too, as `<stem>.<field>` beside the image, e.g. `<key>.cls`, `<key>.txt` for WebDataset)'),
        ('verify', 'VERIFY', 'lazy', ('lazy', 'full'), "How a foreign dataset is checked: `lazy` (default) indexes it reading each sample's head only (the JPEG header) and checks each sample against its format's checksum, or else against the CRC-32 of its first read, on every read; `full` reads every sample once at indexing (a CRC-32 each) before the mount serves any"),
        ('index', 'SHARED_INDEX', None, None, "A shared index of the dataset written by `loosefs index` (default: `<SRC>.loosefs-index` beside the dataset, used when it exists and fits this mount's options; for a bucket prefix of loose objects, its listing): a stale one is refused, naming the file that changed"),
        ('refresh', None, None, None, "A stale shared listing of loose objects (objects added, removed or replaced since `loosefs index`) is replaced: the prefix listed again and the listing rewritten in its place (over HTTPS: the server's listing served instead)"),
        ('index_dir', 'INDEX_DIR', None, None, 'Where the index of a foreign source is kept (default: `index/` under $LOOSEFS_CACHE_DIR, else $XDG_CACHE_HOME/loosefs, else ~/.cache/loosefs)'),
        ('chunk_cache', 'CHUNK_CACHE', '1G', None, 'Memory for decompressed chunks of a compressed source (zstd MDS shards and LitData chunks, deflated zip members), e.g. 2G; the least recently used chunk goes first'),
        ('endpoint_url', 'ENDPOINT_URL', None, None, "Endpoint of the store instead of the cloud's own: an S3-compatible server, e.g. http://127.0.0.1:8333 (default: $AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, the profile's endpoint_url, else AWS), a GCS emulator (default: $STORAGE_EMULATOR_HOST), an Azure blob endpoint with its account, e.g. http://127.0.0.1:10000/devstoreaccount1 (default: the connection string's BlobEndpoint)"),
        ('region', 'REGION', None, None, "S3 region to sign for first (default: $AWS_REGION, the profile's region, else us-east-1); a bucket elsewhere is followed to its own region, as the server names it"),
        ('request_payer', None, None, None, 'S3 Requester Pays: the requests say the requester pays for them (`x-amz-request-payer: requester`, as `aws s3 --request-payer requester`); a Requester Pays bucket refuses requests without it (403)'),
        ('billing_project', 'PROJECT', None, None, "GCS Requester Pays: the Google Cloud project billed for the requests (`x-goog-user-project`, as `gcloud storage --billing-project` and gsutil's `-u`)"),
        ('no_sign_request', None, None, None, 'Send unsigned requests (public buckets and containers); no credentials are looked up'),
        ('profile', 'PROFILE', None, None, 'Profile of the shared AWS files to take credentials and region from (default: $AWS_PROFILE, else `default`)'),
        ('allow_http', None, None, None, 'Allow plain `http://` URLs and endpoints (bytes unencrypted on the wire)'),
        ('ca_bundle', 'CA_BUNDLE', None, None, 'PEM file of extra CA certificates to trust for https (default: $AWS_CA_BUNDLE)'),
        ('cache_dir', 'CACHE_DIR', None, None, 'Local block cache of remote packs: blocks fetched are kept here across mounts of the same object (keyed by URL and ETag) (default: `blocks/` under $LOOSEFS_CACHE_DIR, else $XDG_CACHE_HOME/loosefs, else ~/.cache/loosefs)'),
        ('cache_size', 'CACHE_SIZE', None, None, "Most bytes the cache directory holds, e.g. 20G: this pack's blocks (at most its size) and other packs' (removed least recently used first) (default: what it holds now plus the free space of its file system, less 5% of that file system's size)"),
        ('max_requests', 'MAX_REQUESTS', '16', None, 'Concurrent GETs of 1 MiB or more at most; smaller GETs count for less, down to 1/8 for 128 KiB or less (so up to 8× as many small objects are fetched at once)'),
        ('retries', 'RETRIES', '1000', None, 'Most retries of a failed GET (5xx, SlowDown, reset, refused, timeout), with jittered exponential backoff from 100 ms up to 15 s, before the read answers EIO; the default is as many as fit in --retry-timeout, so an outage shorter than it fails no read'),
        ('retry_timeout', 'RETRY_TIMEOUT', '120', None, 'Longest time spent retrying one GET, seconds'),
        ('request_timeout', 'REQUEST_TIMEOUT', '60', None, 'Time limit of one GET, seconds'),
        ('offline', None, None, None, 'Mount without reaching the server: from a complete block cache of the URL (every block of the samples and the index kept, closed cleanly by an earlier mount), at the ETag recorded there'),
    ),
}


# What each option's value is, for the checks `loosefs.mount(...)` makes before a process
# starts: flag, int (a whole number), size (bytes or 512M, 2G, 8GiB), choice, or text.
KINDS = {
    'mount': {'format': 'text', 'class_names': 'text', 'label': 'text', 'fields': 'choice', 'verify': 'choice', 'index': 'text', 'refresh': 'flag', 'index_dir': 'text', 'chunk_cache': 'size', 'pin': 'size', 'warm': 'flag', 'wait': 'flag', 'keep_pack_cache': 'flag', 'endpoint_url': 'text', 'region': 'text', 'request_payer': 'flag', 'billing_project': 'text', 'no_sign_request': 'flag', 'profile': 'text', 'allow_http': 'flag', 'ca_bundle': 'text', 'cache_dir': 'text', 'cache_size': 'size', 'max_requests': 'int', 'retries': 'int', 'retry_timeout': 'int', 'request_timeout': 'int', 'offline': 'flag', 'decode': 'choice', 'decoded_only': 'flag', 'decode_max_side': 'int', 'decode_cache': 'size', 'decode_threads': 'int', 'decode_ahead': 'int', 'decode_accept_damaged': 'flag', 'keeper': 'flag', 'resend': 'flag', 'threads': 'int', 'log': 'text', 'env_file': 'text', 'debug': 'flag', 'progress_lines': 'flag', 'allow_other': 'flag', 'allow_non_empty': 'flag', 'passthrough': 'choice', 'transport': 'choice', 'metrics_addr': 'text', 'read_ahead_kb': 'int', 'prefetch_max_mb': 'int', 'order_window_mb': 'int', 'push_ahead': 'int'},
    'pack': {'jobs': 'int', 'align': 'int', 'follow_links': 'flag', 'force': 'flag', 'progress_lines': 'flag', 'format': 'text', 'class_names': 'text', 'label': 'text', 'fields': 'choice', 'verify': 'choice', 'index': 'text', 'refresh': 'flag', 'index_dir': 'text', 'chunk_cache': 'size', 'endpoint_url': 'text', 'region': 'text', 'request_payer': 'flag', 'billing_project': 'text', 'no_sign_request': 'flag', 'profile': 'text', 'allow_http': 'flag', 'ca_bundle': 'text', 'cache_dir': 'text', 'cache_size': 'size', 'max_requests': 'int', 'retries': 'int', 'retry_timeout': 'int', 'request_timeout': 'int', 'offline': 'flag'},
    'info': {'format': 'text', 'class_names': 'text', 'label': 'text', 'fields': 'choice', 'verify': 'choice', 'index': 'text', 'refresh': 'flag', 'index_dir': 'text', 'chunk_cache': 'size', 'endpoint_url': 'text', 'region': 'text', 'request_payer': 'flag', 'billing_project': 'text', 'no_sign_request': 'flag', 'profile': 'text', 'allow_http': 'flag', 'ca_bundle': 'text', 'cache_dir': 'text', 'cache_size': 'size', 'max_requests': 'int', 'retries': 'int', 'retry_timeout': 'int', 'request_timeout': 'int', 'offline': 'flag'},
    'index': {'progress_lines': 'flag', 'format': 'text', 'class_names': 'text', 'label': 'text', 'fields': 'choice', 'verify': 'choice', 'index': 'text', 'refresh': 'flag', 'index_dir': 'text', 'chunk_cache': 'size', 'endpoint_url': 'text', 'region': 'text', 'request_payer': 'flag', 'billing_project': 'text', 'no_sign_request': 'flag', 'profile': 'text', 'allow_http': 'flag', 'ca_bundle': 'text', 'cache_dir': 'text', 'cache_size': 'size', 'max_requests': 'int', 'retries': 'int', 'retry_timeout': 'int', 'request_timeout': 'int', 'offline': 'flag'},
}


class MountOptions(TypedDict, total=False):
    """The keyword options of `loosefs.mount(...)` (those of `loosefs mount`), for type checkers."""

    format: Union[str, "os.PathLike[str]"]
    class_names: Union[str, "os.PathLike[str]"]
    label: Union[str, "os.PathLike[str]"]
    fields: Literal['image', 'all']
    verify: Literal['lazy', 'full']
    index: Union[str, "os.PathLike[str]"]
    refresh: bool
    index_dir: Union[str, "os.PathLike[str]"]
    chunk_cache: Union[int, str]
    pin: Union[int, str]
    warm: bool
    wait: bool
    keep_pack_cache: bool
    endpoint_url: Union[str, "os.PathLike[str]"]
    region: Union[str, "os.PathLike[str]"]
    request_payer: bool
    billing_project: Union[str, "os.PathLike[str]"]
    no_sign_request: bool
    profile: Union[str, "os.PathLike[str]"]
    allow_http: bool
    ca_bundle: Union[str, "os.PathLike[str]"]
    cache_dir: Union[str, "os.PathLike[str]"]
    cache_size: Union[int, str]
    max_requests: int
    retries: int
    retry_timeout: int
    request_timeout: int
    offline: bool
    decode: Union[Literal['npy', 'ppm', 'frames'], Sequence[Literal['npy', 'ppm', 'frames']]]
    decoded_only: bool
    decode_max_side: int
    decode_cache: Union[int, str]
    decode_threads: int
    decode_ahead: int
    decode_accept_damaged: bool
    keeper: bool
    resend: bool
    threads: int
    log: Union[str, "os.PathLike[str]"]
    env_file: Union[str, "os.PathLike[str]"]
    debug: bool
    progress_lines: bool
    allow_other: bool
    allow_non_empty: bool
    passthrough: Union[bool, Literal['on', 'off']]
    transport: Literal['auto', 'uring', 'classic']
    metrics_addr: Union[str, "os.PathLike[str]"]
    read_ahead_kb: int
    prefetch_max_mb: int
    order_window_mb: int
    push_ahead: int


class PackOptions(TypedDict, total=False):
    """The keyword options of `loosefs.pack(...)` (those of `loosefs pack`), for type checkers."""

    jobs: int
    align: int
    follow_links: bool
    force: bool
    progress_lines: bool
    format: Union[str, "os.PathLike[str]"]
    class_names: Union[str, "os.PathLike[str]"]
    label: Union[str, "os.PathLike[str]"]
    fields: Literal['image', 'all']
    verify: Literal['lazy', 'full']
    index: Union[str, "os.PathLike[str]"]
    refresh: bool
    index_dir: Union[str, "os.PathLike[str]"]
    chunk_cache: Union[int, str]
    endpoint_url: Union[str, "os.PathLike[str]"]
    region: Union[str, "os.PathLike[str]"]
    request_payer: bool
    billing_project: Union[str, "os.PathLike[str]"]
    no_sign_request: bool
    profile: Union[str, "os.PathLike[str]"]
    allow_http: bool
    ca_bundle: Union[str, "os.PathLike[str]"]
    cache_dir: Union[str, "os.PathLike[str]"]
    cache_size: Union[int, str]
    max_requests: int
    retries: int
    retry_timeout: int
    request_timeout: int
    offline: bool


class InfoOptions(TypedDict, total=False):
    """The keyword options of `loosefs.info(...)` (those of `loosefs info`), for type checkers."""

    format: Union[str, "os.PathLike[str]"]
    class_names: Union[str, "os.PathLike[str]"]
    label: Union[str, "os.PathLike[str]"]
    fields: Literal['image', 'all']
    verify: Literal['lazy', 'full']
    index: Union[str, "os.PathLike[str]"]
    refresh: bool
    index_dir: Union[str, "os.PathLike[str]"]
    chunk_cache: Union[int, str]
    endpoint_url: Union[str, "os.PathLike[str]"]
    region: Union[str, "os.PathLike[str]"]
    request_payer: bool
    billing_project: Union[str, "os.PathLike[str]"]
    no_sign_request: bool
    profile: Union[str, "os.PathLike[str]"]
    allow_http: bool
    ca_bundle: Union[str, "os.PathLike[str]"]
    cache_dir: Union[str, "os.PathLike[str]"]
    cache_size: Union[int, str]
    max_requests: int
    retries: int
    retry_timeout: int
    request_timeout: int
    offline: bool


class IndexOptions(TypedDict, total=False):
    """The keyword options of `loosefs.index(...)` (those of `loosefs index`), for type checkers."""

    progress_lines: bool
    format: Union[str, "os.PathLike[str]"]
    class_names: Union[str, "os.PathLike[str]"]
    label: Union[str, "os.PathLike[str]"]
    fields: Literal['image', 'all']
    verify: Literal['lazy', 'full']
    index: Union[str, "os.PathLike[str]"]
    refresh: bool
    index_dir: Union[str, "os.PathLike[str]"]
    chunk_cache: Union[int, str]
    endpoint_url: Union[str, "os.PathLike[str]"]
    region: Union[str, "os.PathLike[str]"]
    request_payer: bool
    billing_project: Union[str, "os.PathLike[str]"]
    no_sign_request: bool
    profile: Union[str, "os.PathLike[str]"]
    allow_http: bool
    ca_bundle: Union[str, "os.PathLike[str]"]
    cache_dir: Union[str, "os.PathLike[str]"]
    cache_size: Union[int, str]
    max_requests: int
    retries: int
    retry_timeout: int
    request_timeout: int
    offline: bool
