"""S3 Inventory reports, the audit's input, in the format AWS writes them:

* ``report``  — the reports as the jobs use them (:func:`~lightmetrics_pipeline.inventory.report.open_report`,
  :func:`~lightmetrics_pipeline.inventory.report.inventory_dataframe`, ``write_report``)
* ``format``  — the fields, schemas and destinations
* ``reader``  — finding, parsing and reading a report (manifest.json + Parquet/CSV.gz)
* ``writer``  — writing a report from listings (``lmctl inventory snapshot``)
"""
