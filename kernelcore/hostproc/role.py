"""The role of this process ("frontend", "engine-core", "worker-0", ...), for logs and traces."""

_role = "frontend"


def get_role() -> str:
    return _role


def set_role(role: str) -> None:
    global _role
    _role = role
