"""Durations as people read them in progress lines (no heavy imports: `ablate status` uses it)."""


def fmt_time(seconds: float) -> str:
    """42s, 3m07s, 2h05m."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
