"""Maintainers' tools: `make release` (`python -m checks.tools.release`) and the benchmark
(`python -m checks.tools.benchmark`). They may import anything in `checks`; nothing imports them,
and no worker's copy of `checks` holds them.
"""
