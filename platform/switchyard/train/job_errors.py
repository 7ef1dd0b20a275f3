"""Errors in what a job was given, as opposed to failures of the training itself.

Data that cannot be trained on, or checkpoints that exist but none of which can be resumed:
every rank finds the same problem from the same inputs (a checkpoint problem is agreed by all
ranks first), so each rank hands it to its launcher as one line, as a non-finite loss is
handed, and the launcher (`switchyard train run`, `python -m train_jobs.run`, Ray's driver)
prints that line and exits 2 instead of showing every rank's traceback.
"""

from __future__ import annotations

from typing import Any

INPUT_ERROR_KEY = "job_input_error"
"""The key a rank's result (a local launcher's JSON, Ray's `return_value`) carries it under."""


class JobInputError(Exception):
    """The job's data or checkpoints cannot be used; the message names the file and the problem."""


def raise_input_error(result: Any) -> None:
    """Raise on the launcher the `JobInputError` rank 0 handed back in `result`, if any."""
    if isinstance(result, dict) and INPUT_ERROR_KEY in result:
        raise JobInputError(str(result[INPUT_ERROR_KEY]))
