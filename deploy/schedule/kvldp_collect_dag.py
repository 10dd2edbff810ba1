"""Airflow DAG: aggregate the previous day's reports every night.

Clients upload reports under gs://BUCKET/reports/YYYY-MM-DD/; the DAG runs
the collector (a Dataflow Flex Template built from deploy/dataflow/) over
that day's files and writes one estimates file per day.
"""
import pendulum
from airflow import DAG
from airflow.providers.google.cloud.operators.dataflow import DataflowStartFlexTemplateOperator

BUCKET = "my-bucket"

with DAG(
    dag_id="kvldp_daily_collect",
    schedule="30 2 * * *",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["kvldp", "ldp"],
) as dag:
    DataflowStartFlexTemplateOperator(
        task_id="collect_pckv_ue",
        location="europe-west1",
        body={
            "launchParameter": {
                "jobName": "kvldp-collect-{{ ds_nodash }}",
                "containerSpecGcsPath": f"gs://{BUCKET}/templates/kvldp-collect.json",
                "parameters": {
                    "mechanism": "pckv-ue",
                    "epsilon": "4",
                    "input": f"gs://{BUCKET}/reports/{{{{ ds }}}}/REPORTS*.avro",
                    "key_dictionary": f"gs://{BUCKET}/reports/keys.txt",
                    "output": f"gs://{BUCKET}/estimates/{{{{ ds }}}}/pckv-ue.avro",
                },
            }
        },
    )
