"""The request workload: which prompts, by category, the dLLM is traced and scheduled on.

Pure Python plus the offline source packages (no torch). See docs/workload.md.
"""

from .builder import (
    TABLE1_MIX,
    CategorySummary,
    WorkloadSplits,
    allocate,
    build_workload,
    load_pools,
    plan_counts,
)
from .generators import (
    DEFAULT_LONG_CONTEXT_CHARS,
    GENERATORS,
    MATH_OPS,
    MCQ_KINDS,
    SYNTHETIC_TASKS,
    generate,
    make_long_context,
    make_math,
    make_mcq,
    make_synthetic,
)
from .output import EVAL_FILE, SUMMARY_FILE, TRAIN_FILE, write_splits
from .records import (
    CATEGORIES,
    KNOWN_CATEGORIES,
    SYNTHETIC,
    WORKLOAD_SCHEMA_VERSION,
    WorkloadRecord,
    read_workload,
    write_workload,
)
from .sources import (
    DEFAULT_CHAT_MAX_PROMPT_CHARS,
    SOURCES,
    load_humaneval,
    load_ifbench,
    load_sharegpt,
    parse_truncated_json_array,
)

__all__ = [
    "CATEGORIES",
    "DEFAULT_CHAT_MAX_PROMPT_CHARS",
    "DEFAULT_LONG_CONTEXT_CHARS",
    "EVAL_FILE",
    "GENERATORS",
    "KNOWN_CATEGORIES",
    "MATH_OPS",
    "MCQ_KINDS",
    "SOURCES",
    "SUMMARY_FILE",
    "SYNTHETIC",
    "SYNTHETIC_TASKS",
    "TABLE1_MIX",
    "TRAIN_FILE",
    "WORKLOAD_SCHEMA_VERSION",
    "CategorySummary",
    "WorkloadRecord",
    "WorkloadSplits",
    "allocate",
    "build_workload",
    "generate",
    "load_humaneval",
    "load_ifbench",
    "load_pools",
    "load_sharegpt",
    "make_long_context",
    "make_math",
    "make_mcq",
    "make_synthetic",
    "parse_truncated_json_array",
    "plan_counts",
    "read_workload",
    "write_splits",
    "write_workload",
]
