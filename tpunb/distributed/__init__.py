"""``%%tpu_distributed``: a notebook cell on N worker processes of torch.distributed.

``job`` turns the cell and the notebook state it uses into a picklable job, ``launch`` runs
it with torch.distributed's elastic launcher (what ``torchrun`` uses) and brings back output,
errors and returned values, ``worker`` is what each worker process runs, ``backend`` picks
the process-group backend and device per runtime; ``cell`` ties them to the magic and saves
a cell's job for ``torchrun`` on several hosts (``--save``).
"""

from tpunb.distributed.cell import load_returned
from tpunb.distributed.job import Job, UnpicklableVariables, build_job
from tpunb.distributed.launch import DistributedCellError, run_job

__all__ = ["DistributedCellError", "Job", "UnpicklableVariables", "build_job", "load_returned", "run_job"]
