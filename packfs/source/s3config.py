"""Where an ``s3://`` archive's credentials, region and endpoint come from, resolved
as the AWS command-line tools resolve them, most specific first:

1. ``storage_options`` (Python): s3fs's keys, obstore's and boto3's spellings too
   (``key``, ``secret``, ``token``, ``endpoint_url``, ``region``, ``anon``, ``profile``; also
   ``client_kwargs={"endpoint_url": ..., "region_name": ...}`` as s3fs takes them);
2. the environment: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
   ``AWS_SESSION_TOKEN``, ``AWS_REGION`` / ``AWS_DEFAULT_REGION``,
   ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``, ``AWS_PROFILE``;
3. the shared files of that profile (``default`` unless named):
   ``~/.aws/credentials`` (or ``AWS_SHARED_CREDENTIALS_FILE``) and ``~/.aws/config``
   (or ``AWS_CONFIG_FILE``; its sections are ``[profile NAME]``, and ``[default]``).

The values found are handed to the client; none of them is ever put in a message.
No client library is imported here.
"""

from __future__ import annotations

import configparser
import os
from typing import Dict, Mapping, Optional

from ..errors import RemoteArchiveError, RemoteCredentialsError

__all__ = ["S3Settings", "s3_settings", "STORAGE_OPTION_KEYS"]

# storage_options key -> setting; several spellings of one setting are accepted, as
# s3fs, obstore and boto3 spell them (code written for any of them works here).
STORAGE_OPTION_KEYS = {
    "key": "access_key_id", "aws_access_key_id": "access_key_id", "access_key_id": "access_key_id",
    "secret": "secret_access_key", "aws_secret_access_key": "secret_access_key",
    "secret_access_key": "secret_access_key",
    "token": "session_token", "aws_session_token": "session_token", "session_token": "session_token",
    "endpoint_url": "endpoint", "endpoint": "endpoint",
    "region": "region", "region_name": "region",
    "anon": "anon", "skip_signature": "anon",
    "profile": "profile",
}
DEFAULT_REGION = "us-east-1"


class S3Settings(dict):
    """The settings for one bucket (``access_key_id``, ``secret_access_key``,
    ``session_token``, ``region``, ``endpoint``, ``anon``, ``found_in``: where the key
    pair was found, for messages): a dict whose repr shows
    which are set, never their values."""

    def __repr__(self) -> str:
        return f"S3Settings({', '.join(sorted(key for key, value in self.items() if value))})"


def s3_settings(storage_options: Optional[Mapping[str, object]] = None,
                environ: Optional[Mapping[str, str]] = None, url: str = "") -> S3Settings:
    """The settings for an ``s3://`` URL (``url``, without secrets, names it in errors).

    Raises RemoteArchiveError for a ``storage_options`` key it does not know, and
    RemoteCredentialsError when no credentials are found (nor ``anon=True``), or only
    half of a key pair."""
    environ = os.environ if environ is None else environ
    given = _from_storage_options(storage_options or {}, url)
    profile = str(given.pop("profile", "") or environ.get("AWS_PROFILE") or environ.get("AWS_DEFAULT_PROFILE")
                  or "default")
    files = _from_shared_files(profile, environ)
    from_env = {
        "access_key_id": environ.get("AWS_ACCESS_KEY_ID"), "secret_access_key": environ.get("AWS_SECRET_ACCESS_KEY"),
        "session_token": environ.get("AWS_SESSION_TOKEN"),
        "region": environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION"),
        "endpoint": environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL"),
    }
    settings = S3Settings(anon=bool(given.get("anon")))
    # A key pair comes whole from one place: a key from the environment and a secret
    # from a file would be two different identities' halves.
    places = ("storage_options", "the environment (AWS_ACCESS_KEY_ID)",
              f"profile {profile!r} in {_credentials_path(environ)!r} or {_config_path(environ)!r}")
    sources: tuple[Mapping[str, object], ...] = (given, from_env, files)
    for source, place in zip(sources, places):
        if source.get("access_key_id") or source.get("secret_access_key"):
            for name in ("access_key_id", "secret_access_key", "session_token"):
                settings[name] = source.get(name) or None
            settings["found_in"] = place  # for messages: where, never what
            break
    for name in ("region", "endpoint"):
        settings[name] = given.get(name) or from_env.get(name) or files.get(name) or None
    settings["region"] = settings["region"] or DEFAULT_REGION
    if settings["anon"]:
        for name in ("access_key_id", "secret_access_key", "session_token", "found_in"):
            settings.pop(name, None)
        return settings
    if not settings.get("access_key_id") and not settings.get("secret_access_key"):
        raise RemoteCredentialsError(
            f"{url!r}: no AWS credentials found: expected AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            f"profile {profile!r} in {_credentials_path(environ)!r} or {_config_path(environ)!r}, or "
            f"storage_options key and secret (anon=True for a public bucket)")
    if not settings.get("access_key_id") or not settings.get("secret_access_key"):
        missing = "access key id" if not settings.get("access_key_id") else "secret access key"
        raise RemoteCredentialsError(f"{url!r}: the AWS credentials found have no {missing}: expected both halves "
                                     f"of a key pair from one place")
    return settings


def _from_storage_options(options: Mapping[str, object], url: str) -> Dict[str, object]:
    found: Dict[str, object] = {}
    for key, value in options.items():
        if key == "client_kwargs" and isinstance(value, Mapping):
            found.update(_from_storage_options({k: v for k, v in value.items()
                                                if k in ("endpoint_url", "region_name")}, url))
            continue
        if key not in STORAGE_OPTION_KEYS:
            raise RemoteArchiveError(f"{url!r}: unknown storage option {key!r}: expected some of "
                                     f"{', '.join(sorted(set(STORAGE_OPTION_KEYS) | {'client_kwargs'}))}")
        found[STORAGE_OPTION_KEYS[key]] = value
    return found


def _credentials_path(environ: Mapping[str, str]) -> str:
    return environ.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.join(os.path.expanduser("~"), ".aws", "credentials")


def _config_path(environ: Mapping[str, str]) -> str:
    return environ.get("AWS_CONFIG_FILE") or os.path.join(os.path.expanduser("~"), ".aws", "config")


def _from_shared_files(profile: str, environ: Mapping[str, str]) -> Dict[str, Optional[str]]:
    """The profile's values: credentials from the credentials file (or, as the AWS CLI
    allows, the config file), region and endpoint from the config file."""
    credentials = _section(_credentials_path(environ), profile)
    config = _section(_config_path(environ), profile if profile == "default" else f"profile {profile}")
    keys = credentials if credentials.get("aws_access_key_id") else config
    return {
        "access_key_id": keys.get("aws_access_key_id"), "secret_access_key": keys.get("aws_secret_access_key"),
        "session_token": keys.get("aws_session_token"),
        "region": config.get("region"), "endpoint": config.get("endpoint_url"),
    }


def _section(path: str, name: str) -> Dict[str, str]:
    parser = configparser.RawConfigParser()
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, UnicodeDecodeError) as error:
        # Not its contents: a parse error quotes the line, which may hold a secret.
        raise RemoteCredentialsError(f"{path!r}: cannot be read as an AWS shared file ({type(error).__name__})") from None
    return dict(parser.items(name)) if parser.has_section(name) else {}
