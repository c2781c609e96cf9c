"""The inventory audit: the reconciler's comparison at inventory scale, with Spark (docs/pipeline.md):

* ``job``         — the audit job (:func:`~lightmetrics_pipeline.audit.job.run_audit`)
* ``classify``    — every inventory row's kind and fields, in Spark SQL
* ``candidates``  — which keys *may* break a rule of the invariant catalogue, in Spark SQL
* ``confirm``     — each candidate looked at again, live
* ``output``      — confirmed findings as JSON-lines part files per category, and the summary
* ``watermarks``  — the findings the audit counts for its watermarks (docs/protocol.md §13 W6)
"""
