"""The archive / compaction job: what Spark runs over sealed journal segments (docs/batch.md).

    batch.py        the driver: `python -m journal.spark.batch`, spark-submit's script
    spark_env.py    the Spark session, the code shipped to executors, the executors' check
    job_code.py     what executors import first: the shipped zip, the probe, the task entry
    jobs.py         one task's work (archive_group, compact_group), also run without Spark
    compact_job.py  compaction's keep rule and rewrite of one group
    job_input.py    a task's input: one segment file, checked, as columns
    job_commit.py   the driver's verification and commit of what the tasks wrote
    job_progress.py the progress bar

Beside the storage engine, above it: these modules use the journal's format readers and writers
(record.py, walk.py, compacted.py, manifest.py, maintenance.py); the storage engine never imports
them, and only this package imports pyspark. The server starts the job in a child process.
"""
