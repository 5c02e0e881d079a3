"""Run a test module's independent, slow jobs (compilers, CLI processes) side by side in one module-scoped
fixture, while each test still checks and reports its own job.

A fixture hands ``run_jobs`` one callable per key and gets back ``Outcomes``; a test reads its key with
``outcomes[key]``, which returns that job's value or raises the exception the job raised (so a failing job
fails its own test, with its own traceback, and no other). ``selected_params`` gives the parameter values
of the tests of this session that use a fixture, so that running one case with ``-k`` runs one job.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, Hashable, List, Mapping, Optional


def cpu_slots() -> int:
    """CPUs this process may run on (a CI container's share, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class Outcomes:
    def __init__(self, values: Dict[Hashable, object], errors: Dict[Hashable, BaseException]):
        self._values, self._errors = values, errors

    def __getitem__(self, key):
        if key in self._errors:
            raise self._errors[key]
        if key not in self._values:
            raise KeyError(f"no job {key!r} was run (ran: {sorted(map(repr, self._values))})")
        return self._values[key]

    def __contains__(self, key) -> bool:
        return key in self._values or key in self._errors


def run_jobs(jobs: Mapping[Hashable, Callable[[], object]], workers: Optional[int] = None) -> Outcomes:
    """Run every job, at most ``workers`` at a time (default: one per CPU slot, at least two); the jobs
    are expected to spend their time in subprocesses, so threads suffice."""
    workers = workers or max(2, cpu_slots())
    values: Dict[Hashable, object] = {}
    errors: Dict[Hashable, BaseException] = {}
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(jobs)))) as pool:
        futures = {key: pool.submit(job) for key, job in jobs.items()}
        for key, future in futures.items():
            try:
                values[key] = future.result()
            except BaseException as error:  # noqa: BLE001 - handed to the test that reads this key
                errors[key] = error
    return Outcomes(values, errors)


def selected_params(request, argname: str, fixturename: Optional[str] = None, test: Optional[str] = None) -> List:
    """The values of parameter ``argname`` over the collected (selected) tests of this session that
    use fixture ``fixturename`` (default: the requesting fixture), and are named ``test`` (without
    parameters) if given, in collection order, without repeats."""
    fixturename = fixturename or request.fixturename
    seen: List = []
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or fixturename not in getattr(item, "fixturenames", ()):
            continue
        if test is not None and getattr(item, "originalname", None) != test:
            continue
        value = callspec.params.get(argname)
        if value is not None and value not in seen:
            seen.append(value)
    return seen


def selected_tests(request, fixturename: Optional[str] = None) -> List[str]:
    """The names (without parameters) of the collected (selected) tests of this session that use fixture
    ``fixturename`` (default: the requesting fixture)."""
    fixturename = fixturename or request.fixturename
    return sorted({item.originalname for item in request.session.items
                   if fixturename in getattr(item, "fixturenames", ()) and hasattr(item, "originalname")})
