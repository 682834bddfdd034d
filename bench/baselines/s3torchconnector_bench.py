#!/usr/bin/env python3
"""s3torchconnector's DCP writer and reader on the peer scenario (peer_harness.py), on S3.

dcp.save(state, storage_writer=S3StorageWriter(REGION, "s3://BUCKET/PREFIX/STEP",
thread_count=N)) and dcp.load(state, storage_reader=S3StorageReader(...)) with
its default reader (DCPOptimizedS3Reader: ranged GETs of what the load plan
needs), on the DTensor state of the scenario: save 4 rows, load 4 rows -> 2
columns, load 4 -> 4, every element checked. The server is --endpoint
(default $AWS_ENDPOINT_URL; bench/s3_bench.py passes its radosgw), path-style
addressing, credentials from the environment (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY). S3StorageWriter and S3StorageReader take no endpoint
(they build an S3Client for AWS), so each gets an S3FileSystem over an
S3Client(REGION, endpoint=ENDPOINT) in place of its own, the same class with
the endpoint set. A PUT that returned is durable on the server: the save
needs no fsync. --bucket must exist; everything under --prefix is deleted at
the end.

Before the run one small upload goes through S3StorageWriter's client. When
it fails (s3torchconnector 1.5.0 on Debian's radosgw 16.2: every upload is a
multipart upload, and the client wants an ETag header in the
CompleteMultipartUpload answer, which radosgw 16.2 puts only in the XML body:
"Internal S3 client error: Header "ETag" not found", after the object is
stored), the save is not measured (the JSON line says why in
"save_unmeasured") and the loads read the same DCP layout written by
FileSystemWriter to --dir and uploaded with boto3 (untimed).

Run in its own environment: bench/baselines/install.sh makes
.venv-peers/s3torchconnector (bench/baselines/requirements-s3torchconnector.txt).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_harness  # noqa: E402

NAME = "s3torchconnector"


def add_args(p):
    p.add_argument("--endpoint", default=os.environ.get("AWS_ENDPOINT_URL"),
                   help="the S3 server (default $AWS_ENDPOINT_URL)")
    p.add_argument("--bucket", default=None, help="an existing bucket")
    p.add_argument("--prefix", default=f"peer-s3torchconnector-{os.getpid()}",
                   help="key prefix of the checkpoints (deleted at the end)")
    p.add_argument("--region", default=os.environ.get("AWS_REGION", "us-east-1"))
    p.add_argument("--thread-count", type=int, default=1,
                   help="S3StorageWriter thread_count (default 1, its default)")


def probe(args):
    try:
        from s3torchconnector.dcp import S3StorageReader, S3StorageWriter  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    except Exception as e:  # pylint: disable=broad-except
        return f"s3torchconnector.dcp does not import: {e!r}"
    if not args.endpoint or not args.bucket:
        return "needs an S3 server: --endpoint (or AWS_ENDPOINT_URL) and --bucket"
    return None


def info(args):
    from importlib.metadata import version  # pylint: disable=import-outside-toplevel
    return {"s3torchconnector": version("s3torchconnector"),
            "s3torchconnectorclient": version("s3torchconnectorclient"),
            "thread_count": args.thread_count, "endpoint": args.endpoint}


def _client(args):
    from s3torchconnector import S3ClientConfig  # pylint: disable=import-outside-toplevel
    from s3torchconnector._s3client import S3Client  # pylint: disable=import-outside-toplevel
    return S3Client(args.region, endpoint=args.endpoint,
                    s3client_config=S3ClientConfig(force_path_style=True))


def _uri(args, step):
    return f"s3://{args.bucket}/{args.prefix}/{step}"


def save_unmeasured(args):
    """Why S3StorageWriter cannot save to this server, from one small PUT
    through its client (None when it can)."""
    client = _client(args)
    key = f"{args.prefix}/probe"
    try:
        w = client.put_object(args.bucket, key)
        w.write(b"probe")
        w.close()
        return None
    except Exception as e:  # pylint: disable=broad-except
        return (f"S3StorageWriter cannot save to {args.endpoint}: an upload through its "
                f"client fails with {e!r} (the loads read a checkpoint that DCP's "
                f"FileSystemWriter wrote and boto3 uploaded, untimed)")
    finally:
        try:
            client.delete_object(args.bucket, key)
        except Exception:  # pylint: disable=broad-except
            pass


def _stage(ctx, step):
    """The checkpoint the loads read when S3StorageWriter cannot write it:
    the same DCP layout (FileSystemWriter's files are the objects
    S3StorageWriter names), written locally and uploaded with boto3, each
    rank a share of the files."""
    import boto3  # pylint: disable=import-outside-toplevel
    import torch.distributed as dist  # pylint: disable=import-outside-toplevel
    import torch.distributed.checkpoint as dcp  # pylint: disable=import-outside-toplevel
    a = ctx.args
    local = os.path.join(a.dir, "stage", str(step))
    dcp.save(ctx.state, storage_writer=dcp.FileSystemWriter(local))
    dist.barrier()
    names = sorted(os.listdir(local))
    s3 = boto3.client("s3", endpoint_url=a.endpoint, region_name=a.region)
    for name in names[ctx.rank::ctx.world]:
        s3.upload_file(os.path.join(local, name), a.bucket, f"{a.prefix}/{step}/{name}")
    dist.barrier()


def save(ctx, step):
    import torch.distributed.checkpoint as dcp  # pylint: disable=import-outside-toplevel
    if ctx.args.save_unmeasured:
        _stage(ctx, step)
        return
    from s3torchconnector.dcp import S3StorageWriter  # pylint: disable=import-outside-toplevel
    from s3torchconnector.dcp.s3_file_system import S3FileSystem  # pylint: disable=import-outside-toplevel
    a = ctx.args
    w = S3StorageWriter(a.region, _uri(a, step), thread_count=a.thread_count)
    w.fs = S3FileSystem(a.region, s3_client=_client(a))
    w.path = w.fs.init_path(_uri(a, step))
    dcp.save(ctx.state, storage_writer=w)


def load(ctx, step):
    import torch.distributed.checkpoint as dcp  # pylint: disable=import-outside-toplevel
    from s3torchconnector.dcp import S3StorageReader  # pylint: disable=import-outside-toplevel
    from s3torchconnector.dcp.s3_file_system import S3FileSystem  # pylint: disable=import-outside-toplevel
    a = ctx.args
    r = S3StorageReader(a.region, _uri(a, step))
    r.fs = S3FileSystem(a.region, s3_client=_client(a),
                        reader_constructor=r._reader_constructor)  # pylint: disable=protected-access
    r.path = r.fs.init_path(_uri(a, step))
    dcp.load(ctx.state, storage_reader=r)
    return ctx.locals()


def cleanup(args):
    if not args.endpoint or not args.bucket:
        return
    client = _client(args)
    try:
        keys = [o.key for page in client.list_objects(args.bucket, args.prefix + "/")
                for o in page.object_info]
        for key in keys:
            client.delete_object(args.bucket, key)
    except Exception as e:  # pylint: disable=broad-except
        peer_harness.log(f"cleanup of s3://{args.bucket}/{args.prefix}/: {e!r}")


if __name__ == "__main__":
    peer_harness.main(sys.modules[__name__])
