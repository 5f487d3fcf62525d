"""AWS Signature Version 4 for the GETs of an ``s3://`` archive: a pure function of the
request, the key pair and the time (no client library, no I/O), so that RemoteFile
needs nothing beyond an HTTP client to read S3.

What is signed: the method, the path (percent-encoded once, as sent: S3 does not
encode it twice), the query string (a ``versionId``), the headers ``host``,
``x-amz-content-sha256``, ``x-amz-date`` and, with temporary credentials,
``x-amz-security-token``.  ``Range`` and ``If-Match`` are left unsigned: S3 does not
require them signed, and a signature covering them could not be reused by a retry
that changes nothing else anyway.  The payload of a GET is empty, so its hash is the
SHA-256 of no bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import Dict, Mapping, Optional
from urllib.parse import quote

__all__ = ["sign_v4", "canonical_query", "encode_key", "EMPTY_SHA256"]

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_UNRESERVED = "-_.~"


def encode_key(key: str) -> str:
    """An object key as a URI path: each ``/``-separated segment percent-encoded, every
    byte but the unreserved ones (``A-Z a-z 0-9 - _ . ~``), as SigV4 asks."""
    return "/".join(quote(segment, safe=_UNRESERVED) for segment in key.split("/"))


def canonical_query(params: Mapping[str, str]) -> str:
    """``params`` as SigV4's canonical query string (and as sent): names and values
    percent-encoded, sorted by name."""
    return "&".join(f"{quote(name, safe=_UNRESERVED)}={quote(value, safe=_UNRESERVED)}"
                    for name, value in sorted(params.items()))


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def sign_v4(method: str, host: str, path: str, query: str, *, region: str, access_key_id: str,
            secret_access_key: str, session_token: Optional[str] = None, when: Optional[float] = None,
            payload_sha256: str = EMPTY_SHA256, service: str = "s3",
            extra_signed: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The headers that sign one request: ``Authorization``, ``x-amz-date``,
    ``x-amz-content-sha256`` and, given a ``session_token``, ``x-amz-security-token``
    (send them with ``Host: host``).

    ``path`` and ``query`` are as sent (``path`` already percent-encoded, ``query``
    canonical: see :func:`encode_key` and :func:`canonical_query`); ``when`` is the
    time to sign for (now by default); ``extra_signed`` are further headers to sign
    (for AWS's published examples, which sign ``Range``), sent as given."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if when is None else when))
    day = stamp[:8]
    headers = {"host": host, "x-amz-content-sha256": payload_sha256, "x-amz-date": stamp}
    if session_token:
        headers["x-amz-security-token"] = session_token
    for name, value in (extra_signed or {}).items():
        headers[name.lower()] = value
    names = sorted(headers)
    canonical_headers = "".join(f"{name}:{' '.join(str(headers[name]).split())}\n" for name in names)
    signed = ";".join(names)
    canonical_request = "\n".join([method, path or "/", query, canonical_headers, signed, payload_sha256])
    scope = f"{day}/{region}/{service}/aws4_request"
    string_to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope,
                                hashlib.sha256(canonical_request.encode()).hexdigest()])
    key = _hmac(_hmac(_hmac(_hmac(("AWS4" + secret_access_key).encode(), day), region), service), "aws4_request")
    signature = hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()
    sent = {name: value for name, value in headers.items() if name != "host"}
    sent["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={access_key_id}/{scope}, SignedHeaders={signed}, "
                             f"Signature={signature}")
    return sent
