"""Object storage for `--from` and `export --out`: DuckDB's httpfs, else s3fs, loaded only when needed.

A location is remote when it has a URL scheme (`s3://bucket/prefix`; httpfs
also reads `gcs://`, `r2://` and `https://`). The connection that reads or
writes it gets one of, in this order:

- DuckDB's httpfs extension, when it is installed. llmtap never downloads it:
  install it once yourself (`INSTALL httpfs`; DuckDB keeps it in
  ~/.duckdb/extensions; DuckDB's extensions are not on PyPI).
- s3fs (`pip install 'llmtap[s3]'`, only PyPI), an fsspec filesystem
  registered on the connection (`remote_fs.py`): s3:// on AWS or any
  S3-compatible store.

`LLMTAP_OBJECT_STORE=httpfs` or `=s3fs` picks one instead.

Credentials: when AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are set, they
are used with AWS_SESSION_TOKEN, AWS_REGION (or AWS_DEFAULT_REGION) and
AWS_ENDPOINT_URL_S3 (or AWS_ENDPOINT_URL, for MinIO and other S3-compatible
stores): httpfs gets a temporary S3 secret made from them, s3fs its
arguments. Otherwise httpfs uses the persistent secrets DuckDB finds, e.g.
one made once with `CREATE PERSISTENT SECRET (TYPE s3, PROVIDER
credential_chain)`, and s3fs botocore's chain (AWS profiles, SSO, instance
roles).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import duckdb

from analysis.filters import sql_string

_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
SECRET_NAME = "llmtap_s3_from_env"
CHOICE = "LLMTAP_OBJECT_STORE"  # httpfs or s3fs; unset: httpfs when installed, else s3fs
_TRACEBACK = "Traceback (most recent call last)"
HTTPFS_INSTALL = "python -c \"import duckdb; duckdb.execute('INSTALL httpfs')\""


class RemoteError(Exception):
    """Object storage cannot be used; the message says what to do."""


def is_remote(location: str) -> bool:
    return bool(_SCHEME.match(location))


def enable_remote(con: duckdb.DuckDBPyConnection, env: Mapping[str, str], locations: Iterable[str]) -> str:
    """Let `con` read and write `locations` (remote URLs, globs allowed): httpfs or s3fs, the one used."""
    from analysis import remote_fs

    choice = env.get(CHOICE, "").strip().lower()
    if choice not in ("", "httpfs", "s3fs"):
        raise RemoteError(f"{CHOICE}={choice!r}: choose httpfs or s3fs, or leave it unset")
    if choice != "s3fs":
        try:
            enable_httpfs(con, env)
            return "httpfs"
        except RemoteError:
            if choice == "httpfs":
                raise
            if not remote_fs.available():
                raise RemoteError(
                    "reading or writing object storage needs s3fs or DuckDB's httpfs extension, and neither is"
                    " installed: pip install 'llmtap[s3]' (s3:// on AWS or any S3-compatible store, from PyPI);"
                    f" or httpfs, once: {HTTPFS_INSTALL}") from None
    try:
        remote_fs.register(con, env, locations)
    except remote_fs.Missing:
        raise RemoteError(f"{CHOICE}=s3fs needs s3fs: pip install 'llmtap[s3]'") from None
    except remote_fs.StoreError as exc:
        raise RemoteError(str(exc)) from None
    return "s3fs"


def explain(exc: BaseException) -> str:
    """A DuckDB error, shortened to its last line when it carries a Python traceback (s3fs's)."""
    text = str(exc)
    if _TRACEBACK not in text:
        return text
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else text


def enable_httpfs(con: duckdb.DuckDBPyConnection, env: Mapping[str, str]) -> None:
    """Load httpfs on `con` (it must be installed already) and add the S3 secret from `env`, if any."""
    try:
        con.execute("LOAD httpfs")
    except duckdb.Error as exc:
        raise RemoteError(
            "reading or writing object storage needs DuckDB's httpfs extension, which is not installed"
            f" ({str(exc).splitlines()[0]}). llmtap downloads nothing by itself; install it once with:"
            f" {HTTPFS_INSTALL}; or, with only PyPI, pip install 'llmtap[s3]' for s3://") from None
    secret = s3_secret_sql(env)
    if secret is not None:
        con.execute(secret)


def s3_secret_sql(env: Mapping[str, str]) -> str | None:
    """CREATE SECRET for the AWS_* variables in `env`, or None when no key is set."""
    key, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    if not key or not secret:
        return None
    options = {"TYPE": "s3", "PROVIDER": "config", "KEY_ID": sql_string(key), "SECRET": sql_string(secret)}
    token = env.get("AWS_SESSION_TOKEN")
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if token:
        options["SESSION_TOKEN"] = sql_string(token)
    if region:
        options["REGION"] = sql_string(region)
    if endpoint:
        host = _SCHEME.sub("", endpoint).rstrip("/")
        options.update(ENDPOINT=sql_string(host), URL_STYLE="'path'",
                       USE_SSL="false" if endpoint.startswith("http://") else "true")
    body = ", ".join(f"{name} {value}" for name, value in options.items())
    return f"CREATE OR REPLACE TEMPORARY SECRET {SECRET_NAME} ({body})"
