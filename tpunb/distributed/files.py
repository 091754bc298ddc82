"""The files a distributed cell's job directory holds (shared by the notebook and workers)."""

JOB_FILE = "job.pkl"
RESULT_FILE = "returned.pkl"
ERROR_FILE = "error.json"  # one per failed rank: error.json.<rank>
LOG_DIR = "logs"
