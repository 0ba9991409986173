"""The passwords and query strings of the store URLs given in this process, hidden in every message.

Process-wide by design: a URL given once (`open_store("https://u:pw@host/s")`) must not appear in any message this
process prints or a server sends afterwards, whichever layer words it.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

# The user parts with a password ("user:pw@") and the http(s) query strings ("?sig=...") of the store URLs given in
# this process, as they appear in a URL, each with what shows instead.
_SECRETS: dict[str, str] = {}
URL_PASSWORD = re.compile(r"://([^/@:\s]*):([^/@\s]*)@")  # a URL's user part that holds a password: user, password


def password_hidden(url: str) -> str:
    """`url` with the password of each user part shown as `***`, found by pattern: it needs no URL parser, so it
    serves a URL that Python's parser refuses, and a serve argument ("=http://u:pw@h") with no scheme."""
    return URL_PASSWORD.sub(r"://\1:***@", url)


def remember_secrets(url: str) -> None:
    """Note the password-bearing user part (and the http(s) query string) of each part of a store URL, for
    `scrubbed`. As they appear in URLs ("user:pw@", "?q"), never the bare password: one of "a" would have
    starred every "a" of every message."""
    for user, password in URL_PASSWORD.findall(url):
        _SECRETS[f"{user}:{password}@"] = f"{user}:***@"
    for part in url.split("::"):
        parts = urlsplit(part)
        if parts.query and parts.scheme in ("http", "https"):
            _SECRETS[f"?{parts.query}"] = "?***"


def scrubbed(text: str) -> str:
    """`text` with every user part and query string `remember_secrets` noted hidden: messages name a store's files
    by their full URL, and `serve` sends its messages to any client (it has no authentication)."""
    for secret in sorted(_SECRETS, key=len, reverse=True):
        text = text.replace(secret, _SECRETS[secret])
    return text
