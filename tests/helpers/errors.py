"""What every tpviz error message must be: one line, not empty."""


def one_line(exc: BaseException) -> bool:
    return "\n" not in str(exc) and str(exc).strip() != ""
