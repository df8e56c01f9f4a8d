"""Object storage for `--from` and `export --out`: DuckDB's httpfs extension, loaded only when needed.

A location is remote when it has a URL scheme (`s3://bucket/prefix`; httpfs
also reads `gcs://`, `r2://` and `https://`). httpfs is loaded on the
connection that reads or writes it. llmtap never downloads it: install it
once yourself (`INSTALL httpfs`; DuckDB keeps it in ~/.duckdb/extensions).

Credentials: when AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are set, a
temporary S3 secret is made from them and AWS_SESSION_TOKEN, AWS_REGION (or
AWS_DEFAULT_REGION) and AWS_ENDPOINT_URL_S3 (or AWS_ENDPOINT_URL, for MinIO
and other S3-compatible stores). Otherwise DuckDB uses the persistent
secrets it finds, e.g. one made once with
`CREATE PERSISTENT SECRET (TYPE s3, PROVIDER credential_chain)`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import duckdb

from .filters import sql_string

_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
SECRET_NAME = "llmtap_s3_from_env"


class RemoteError(Exception):
    """httpfs could not be loaded; the message says what to do."""


def is_remote(location: str) -> bool:
    return bool(_SCHEME.match(location))


def enable_httpfs(con: duckdb.DuckDBPyConnection, env: Mapping[str, str]) -> None:
    """Load httpfs on `con` (it must be installed already) and add the S3 secret from `env`, if any."""
    try:
        con.execute("LOAD httpfs")
    except duckdb.Error as exc:
        raise RemoteError(
            "reading or writing object storage needs DuckDB's httpfs extension, which is not installed"
            f" ({str(exc).splitlines()[0]}). llmtap downloads nothing by itself; install it once with:"
            " python -c \"import duckdb; duckdb.execute('INSTALL httpfs')\"") from None
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
