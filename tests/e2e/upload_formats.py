#!/usr/bin/env python3
"""Writes an MDS dataset and a LitData dataset straight to S3 with the formats' own uploaders,
for test_remote_formats.py: MosaicML's MDSWriter with `out=(LOCAL, "s3://BUCKET/mds-upload/")`
(its upload thread, `S3_ENDPOINT_URL`), and LitData's `optimize(output_dir="s3://BUCKET/
litdata-upload/", storage_options={"endpoint_url": ...})`. The first 12 classes of
imagenet-sample (class i = label i), as write_formats.py takes them.

Usage: upload_formats.py SAMPLES LOCAL ENDPOINT BUCKET (credentials from the AWS_* environment)
"""
import os
import sys

from write_formats import items


def _lit(x):
    from PIL import Image

    i, c, p = x
    return (Image.open(p), i)


def main():
    samples, local, endpoint, bucket = sys.argv[1:5]
    it = items(samples)
    os.environ["S3_ENDPOINT_URL"] = endpoint
    from PIL import Image
    from streaming import MDSWriter

    with MDSWriter(out=(os.path.join(local, "mds"), f"s3://{bucket}/mds-upload/"),
                   columns={"image": "jpeg", "label": "int", "synset": "str"}, size_limit=512 << 10,
                   keep_local=True) as w:
        for i, c, p in it:
            w.write({"image": Image.open(p), "label": i, "synset": c})
    from litdata import optimize

    optimize(fn=_lit, inputs=it, output_dir=f"s3://{bucket}/litdata-upload/", chunk_bytes="512KB", num_workers=1,
             storage_options={"endpoint_url": endpoint})


if __name__ == "__main__":
    main()
