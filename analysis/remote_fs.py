"""s3:// without httpfs: s3fs, an fsspec filesystem, registered on the DuckDB connection.

DuckDB's Python package lets a connection read and write through any fsspec
filesystem (`register_filesystem`): it calls the filesystem's `glob`, `ls`,
`isdir`, `mkdir`, `open`, `size`, `rm` (duckdb-python's pyfilesystem.cpp).
s3fs is one, kept by the fsspec project, and reaches AWS S3 and every
S3-compatible store (MinIO, R2, Ceph, ...) with nothing but PyPI
(`pip install 'llmtap[s3]'`). Two things differ from a disk, and `_S3` adapts
them for DuckDB, in the public methods DuckDB calls (`ls`, `mkdir`, `makedirs`): listing a prefix that holds nothing is an empty list (s3fs
raises FileNotFoundError, which DuckDB reports as an error before a COPY), and
"making a directory" never creates a bucket (s3fs would create a misspelled one).
Listings are cached for the connection's life (one command; s3fs forgets a
prefix when it writes there): DuckDB globs the same prefixes for every query.

Before DuckDB touches a location, its bucket is checked once (`check`), so a
wrong endpoint, a missing bucket and refused credentials are one clear line
each, never a traceback. No message names a key: the values of the AWS_*
secrets are blanked out of whatever the store answered.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

import duckdb

try:
    import s3fs
    from fsspec.asyn import sync
    from botocore.exceptions import BotoCoreError, NoCredentialsError
except ImportError as exc:  # the `s3` extra is not installed
    _MISSING: ImportError | None = exc
else:
    _MISSING = None

SCHEMES = ("s3", "s3a")
SECRET_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 60.0
ATTEMPTS = 2  # botocore's, per request: a refused connection fails in about a second (s3fs retries more on its own)


class Missing(Exception):
    """s3fs is not installed."""


class StoreError(Exception):
    """The object store cannot be used as configured; the message is for the user and names no secret."""


def available() -> bool:
    return _MISSING is None


if _MISSING is None:
    class _S3(s3fs.S3FileSystem):
        """s3fs as DuckDB expects a filesystem to behave (see the module docstring)."""

        def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
            """The public blocking `ls`, through fsspec's `sync` over the async API's `_ls` (as fsspec's own
            wrapper does): s3fs's own code keeps its `_ls`, a missing prefix and all."""
            try:
                return sync(self.loop, self._ls, path, detail=detail, **kwargs)
            except FileNotFoundError:
                return []

        def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
            pass  # S3 has no directories; buckets are made by their owner, not by an export

        def makedirs(self, path: str, exist_ok: bool = False) -> None:
            pass


def settings(env: Mapping[str, str]) -> dict[str, Any]:
    """S3FileSystem's arguments from the AWS_* variables in `env` (as remote.s3_secret_sql reads them).
    Without a key, botocore's own chain (profiles, SSO, instance roles) finds the credentials."""
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    endpoint = endpoint_of(env)
    config: dict[str, Any] = {"connect_timeout": CONNECT_TIMEOUT_S, "read_timeout": READ_TIMEOUT_S,
                              "retries": {"max_attempts": ATTEMPTS, "mode": "standard"}}
    if endpoint:
        config["s3"] = {"addressing_style": "path"}  # MinIO and most self-hosted stores
    options: dict[str, Any] = {"skip_instance_cache": True,
                               "config_kwargs": config, "client_kwargs": {}}
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        options.update(key=env["AWS_ACCESS_KEY_ID"], secret=env["AWS_SECRET_ACCESS_KEY"])
        if env.get("AWS_SESSION_TOKEN"):
            options["token"] = env["AWS_SESSION_TOKEN"]
    if region:
        options["client_kwargs"]["region_name"] = region
    if endpoint:
        options["endpoint_url"] = endpoint
    return options


def endpoint_of(env: Mapping[str, str]) -> str | None:
    return env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None


def register(con: duckdb.DuckDBPyConnection, env: Mapping[str, str], locations: Iterable[str]) -> None:
    """Make s3:// readable and writable on `con`, after checking each location's bucket."""
    if _MISSING is not None:
        raise Missing(str(_MISSING))
    locations = list(locations)
    for location in locations:
        if urlsplit(location).scheme.lower() not in SCHEMES:
            raise StoreError(f"{location}: without DuckDB's httpfs extension only s3:// locations can be read"
                             " or written (any S3-compatible store, through AWS_ENDPOINT_URL)")
    fs = _S3(**settings(env))
    for bucket in dict.fromkeys(urlsplit(location).netloc for location in locations):
        check(fs, bucket, env)
    if "s3" not in con.list_filesystems():
        con.register_filesystem(fs)


def check(fs: Any, bucket: str, env: Mapping[str, str]) -> None:
    """One listing of `bucket`: StoreError for a store that cannot be reached, a bucket that is not
    there, or credentials it refuses."""
    endpoint = endpoint_of(env)
    where = f"the object store at {_origin(endpoint)}" if endpoint else "AWS S3"
    try:
        fs.call_s3("list_objects_v2", Bucket=bucket, MaxKeys=1)
    except FileNotFoundError:
        raise StoreError(f"no bucket {bucket!r} at {where}") from None
    except PermissionError as exc:
        raise StoreError(f"{where} refused access to bucket {bucket!r} ({_clean(exc, env)}): check"
                         " AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY") from None
    except NoCredentialsError:
        raise StoreError(f"no credentials for {where}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
                         " (or an AWS profile)") from None
    except (BotoCoreError, OSError) as exc:
        hint = " (AWS_ENDPOINT_URL)" if endpoint else ""
        raise StoreError(f"cannot reach {where}{hint}: {_reason(exc, env)}") from None


def _origin(url: str) -> str:
    """scheme://host:port, without a path or anything before an @."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or ''}{f':{parts.port}' if parts.port else ''}"


def _reason(exc: BaseException, env: Mapping[str, str]) -> str:
    text = _clean(exc, env)
    if "Could not connect to the endpoint URL" in text:
        return "could not connect"
    errno = re.search(r"\[Errno -?\d+\] [^\"')\]]+", text)
    return errno.group(0).strip() if errno else text[:200]


def _clean(exc: BaseException, env: Mapping[str, str]) -> str:
    """The exception's text with every AWS_* secret blanked out."""
    text = str(exc) or type(exc).__name__
    for name in SECRET_VARIABLES:
        if value := env.get(name):
            text = text.replace(value, "***")
    return text
