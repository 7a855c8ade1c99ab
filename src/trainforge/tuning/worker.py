"""A tune worker process: runs one trial each time the coordinator asks. Started by `tune.workers`.

    python -m trainforge.tuning.worker        # stdin: one JSON job line, then "run" lines; EOF stops it

It writes JSON event lines on its stdout ({"event": "ready"}, {"event": "started", "number": N},
{"event": "finished", "number": N}); everything else it or the libraries print goes to stderr.
Study, trials and results live in the shared storage: the coordinator reads them from there.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, TextIO

from trainforge.errors import UserError
from trainforge.tuning.space import param_from_dict
from trainforge.tuning.study import PRUNERS, make_sampler, open_storage


def _emit(events: TextIO, event: str, **fields: Any) -> None:
    events.write(json.dumps({"event": event, **fields}) + "\n")
    events.flush()


def serve(events: TextIO, commands: TextIO) -> None:
    import optuna  # heavy: loaded with the trial code below, before "ready"

    from trainforge.tuning.trial import TrialJob, run_trial  # loads torch and the loop before "ready"

    spec = json.loads(commands.readline())
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    job = TrialJob(
        base_config=spec["base_config"],
        space={k: param_from_dict(v) for k, v in spec["space"].items()},
        metric=spec["metric"],
        out=spec["out"],
        worker_overrides=spec["worker_overrides"],
    )
    storage = open_storage(spec["storage"])
    study = optuna.load_study(study_name=spec["study"], storage=storage, sampler=make_sampler(spec["sampler_seed"]),
                              pruner=PRUNERS.get(spec["pruner"])())
    _emit(events, "ready")
    for line in commands:
        if line.strip() != "run":
            break
        started: list[int] = []

        def on_start(number: int) -> None:
            started.append(number)
            _emit(events, "started", number=number)

        # optimize (not ask/tell) for its heartbeat thread and stale-trial check; exceptions become FAIL trials
        study.optimize(lambda trial: run_trial(trial, job, on_start=on_start), n_trials=1, catch=(Exception,))
        _emit(events, "finished", number=started[0] if started else None)


def main() -> None:
    # the event channel is a private copy of stdout; stdout itself now goes to stderr so that no stray print
    # (ours or a library's) can corrupt the events
    events = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        serve(events, sys.stdin)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:  # noqa: BLE001 - the coordinator reports the exit code; say why here

        if not isinstance(e, UserError):
            raise
        print(f"tune worker: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
