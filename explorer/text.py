"""User-supplied text (model names, paths, error lines quoting them) shown literally, never as Markdown."""
import re

_SPECIAL = re.compile(r"([\\`*_{}\[\]()<>#+!|~$])")


def literal(text: object) -> str:
    """text with every Markdown/HTML/LaTeX-active character escaped, and URLs broken up so none auto-links."""
    return _SPECIAL.sub(r"\\\1", str(text)).replace("://", ":\\/\\/").replace("www.", "www\\.")
