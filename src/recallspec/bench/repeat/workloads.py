"""The workloads of ``recallspec bench repeat`` (``bench/repeat/command.py``): its settings and
the conversations they make (chat requests, sent one at a time, so the timings of the
two arms compare):

* ``self_consistency``: GSM8K test questions, ``samples`` answers each at temperature
  0.7 with seeds 0..samples-1 (the same seeds in both arms); one tenant per question
  (``tenancy="shared"``: one for all), so a question's later samples may draft from its
  earlier ones;
* ``code_edit``: HumanEval and MBPP tasks (half each), then follow-up turns asking to
  change the code just written (rename the function, add a docstring, add a unit
  test); greedy; one tenant per task. A follow-up re-emits most of the previous answer.
  With ``code_edit_history`` (the default, what a chat client sends) each follow-up
  carries the whole conversation so far, so the previous answer is in the prompt and
  the request's own automaton drafts it: the memory has nothing to add. Without it each
  follow-up is a fresh conversation, the task and the change asked for (a stateless
  client, an agent re-prompting): the previous answer is only in the memory;
* ``reask``: Spec-Bench first turns (others than the control's), each sent
  ``reask_times`` times in a row in a fresh conversation (a user pressing
  "regenerate", an agent retrying a step) at ``reask_temperature`` (0: greedy), one
  tenant for all: the repetition is not in the prompt, the memory is its only source;
* ``spec_bench``: Spec-Bench first turns (evenly over its six categories), greedy, one
  tenant for all: the control, with nothing to repeat.

Building them reads the benchmark data only; no server, model or network.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from recallspec.bench.common.suites import (
    SPEC_BENCH_CATEGORIES,
    Question,
    SuiteSelection,
    load_suite,
)
from recallspec.errors import DataError

WORKLOADS = ("self_consistency", "code_edit", "reask", "spec_bench")
GREEDY_WORKLOADS = ("code_edit", "spec_bench")  # reask: greedy at reask_temperature 0
DEFAULT_MAX_TOKENS = {"self_consistency": 128, "code_edit": 192, "reask": 128,
                      "spec_bench": 128}
FOLLOW_UPS = (
    "Rename the function to `solution`. Return the whole code.",
    "Add a docstring to the function. Return the whole code.",
    "Add a unit test for the function, a function `test_solution` with a few asserts. "
    "Return the whole code.",
)
GSM8K_INSTRUCTION = "Solve this step by step, then give the final answer.\n\n"


@dataclass(frozen=True)
class RepeatConfig:
    workloads: tuple[str, ...] = WORKLOADS
    drafters: tuple[str, ...] = ("sam+recycling", "sam")
    mode: str = "adaptive"  # the servers' --mode (README: cost-aware sizing on a CPU)
    memory_tokens: int = 200_000  # the memory arm's --memory-tokens
    questions: int = 8  # self_consistency: GSM8K test questions
    samples: int = 8  # self_consistency: answers per question
    temperature: float = 0.7  # self_consistency
    tenancy: str = "question"  # self_consistency: "question" (a tenant each) or "shared"
    tasks: int = 8  # code_edit: half HumanEval, half MBPP
    follow_ups: int = 3  # code_edit: turns after the first (at most len(FOLLOW_UPS))
    code_edit_history: bool = True  # code_edit: follow-ups with the conversation so far
    reask_prompts: int = 8  # reask: Spec-Bench first turns
    reask_times: int = 2  # reask: sends of each (the first and the re-sends)
    reask_temperature: float = 0.0  # reask: 0 = greedy
    prompts: int = 12  # spec_bench: first turns
    max_tokens: int | None = None  # per request; default DEFAULT_MAX_TOKENS per workload
    seed: int = 0  # self_consistency: sample k of a question has seed 1000 * seed + k
    model: str | None = None
    dtype: str = "auto"
    threads: int | None = None  # per server; default all CPUs
    context: int = 2048  # the servers' --max-len
    request_timeout: float = 600.0
    start_timeout: float = 900.0
    data_dir: str | None = None

    def __post_init__(self) -> None:
        for w in self.workloads:
            if w not in WORKLOADS:
                raise DataError(f"unknown workload {w!r}; available: {', '.join(WORKLOADS)}")
        if not self.workloads or not self.drafters:
            raise DataError("give at least one workload and one drafter")
        if self.memory_tokens < 1:
            raise DataError("--memory-tokens must be >= 1 (the arm without memory is run anyway)")
        if min(self.questions, self.samples, self.tasks, self.prompts, self.reask_prompts) < 1:
            raise DataError("--questions, --samples, --tasks, --prompts and --reask-prompts "
                            "must be >= 1")
        if self.reask_times < 2:
            raise DataError("--reask-times must be >= 2 (the first send and a re-send)")
        if not 0 <= self.reask_temperature <= 2:
            raise DataError("--reask-temperature must be in [0, 2]")
        if not 0 <= self.follow_ups <= len(FOLLOW_UPS):
            raise DataError(f"--follow-ups must be in 0..{len(FOLLOW_UPS)}")
        if self.tenancy not in ("question", "shared"):
            raise DataError("--tenancy must be 'question' or 'shared'")
        if not 0 < self.temperature <= 2:
            raise DataError("--temperature must be in (0, 2]")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise DataError("--max-tokens must be >= 1")
        if self.threads is not None and self.threads < 1:
            raise DataError("--threads must be >= 1")

    def tokens_for(self, workload: str) -> int:
        return self.max_tokens or DEFAULT_MAX_TOKENS[workload]

    def temperature_for(self, workload: str) -> float:
        """0 = greedy."""
        if workload in GREEDY_WORKLOADS:
            return 0.0
        return self.reask_temperature if workload == "reask" else self.temperature


@dataclass(frozen=True)
class Conversation:
    """One unit of a workload: its user turns (answered in order, each with the
    conversation so far unless ``history`` is off) or one prompt asked ``samples``
    times."""

    workload: str
    id: str
    tenant: str
    turns: tuple[str, ...]
    samples: int = 1  # > 1: the single turn sent this many times (sampled: seeds 0..n-1)
    history: bool = True  # False: every turn a fresh conversation


def load_workloads(cfg: RepeatConfig) -> list[Conversation]:
    out: list[Conversation] = []
    for w in cfg.workloads:
        if w == "self_consistency":
            qs = load_suite("gsm8k", SuiteSelection(per_category=cfg.questions), cfg.data_dir)
            out += [Conversation(w, f"gsm8k-{q.question_id}",
                                 f"gsm8k-{q.question_id}" if cfg.tenancy == "question"
                                 else "gsm8k", (GSM8K_INSTRUCTION + q.turns[0],), cfg.samples)
                    for q in qs]
        elif w == "code_edit":
            n_he = (cfg.tasks + 1) // 2
            qs = load_suite("humaneval", SuiteSelection(per_category=n_he), cfg.data_dir)
            if cfg.tasks > n_he:
                qs += load_suite("mbpp", SuiteSelection(per_category=cfg.tasks - n_he),
                                 cfg.data_dir)
            out += [Conversation(w, f"{q.category}-{q.question_id}",
                                 f"code-{q.category}-{q.question_id}",
                                 _code_turns(q.turns[0], cfg), history=cfg.code_edit_history)
                    for q in qs]
        elif w == "reask":
            out += [Conversation(w, f"reask-{q.question_id}", "reask", (q.turns[0],),
                                 cfg.reask_times) for q in _reask(cfg)]
        else:
            out += [Conversation(w, f"spec_bench-{q.question_id}", "spec_bench", (q.turns[0],))
                    for q in _spec_bench(cfg)]
    return out


def _code_turns(task: str, cfg: RepeatConfig) -> tuple[str, ...]:
    """The task, then the follow-ups: as turns of one conversation, or (no history) as
    fresh requests that restate the task."""
    asks = FOLLOW_UPS[:cfg.follow_ups]
    return (task, *(asks if cfg.code_edit_history else (f"{task}\n\n{a}" for a in asks)))


def _spec_bench(cfg: RepeatConfig, n: int | None = None) -> list[Question]:
    """``n`` (default ``cfg.prompts``) first turns, round-robin over the categories
    (evenly spaced within each, as ``--per-category``)."""
    n = cfg.prompts if n is None else n
    k = math.ceil(n / len(SPEC_BENCH_CATEGORIES))
    by_cat: dict[str, list[Question]] = {}
    for q in load_suite("spec_bench", SuiteSelection(per_category=k), cfg.data_dir):
        by_cat.setdefault(q.category, []).append(q)
    out = [qs[i] for i in range(k) for qs in by_cat.values() if i < len(qs)]
    return out[:n]


def _reask(cfg: RepeatConfig) -> list[Question]:
    """``cfg.reask_prompts`` Spec-Bench first turns none of which is in the control."""
    control = {q.question_id for q in _spec_bench(cfg)}
    pool = _spec_bench(cfg, cfg.reask_prompts + len(control))
    return [q for q in pool if q.question_id not in control][:cfg.reask_prompts]
