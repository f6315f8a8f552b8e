"""Topic and stream protocol identifiers: the only strings two nodes must agree on."""

CAPACITY_TOPIC = "meshminer/capacity/1"
RECEIPTS_TOPIC = "meshminer/receipts/1"
EVIDENCE_TOPIC = "meshminer/evidence/1"  # a failed spot check, with the worker's signed claim

# request/response streams
ADS_PROTOCOL = "/meshminer/ads/1"  # fetch a peer's current ad table when a connection opens
PROBE_PROTOCOL = "/meshminer/probe/1"  # a peer's own fresh ad, asked just before an offer
REGISTER_PROTOCOL = "/meshminer/directory/register/1"  # volunteer -> directory: its ad
QUERY_PROTOCOL = "/meshminer/directory/query/1"  # owner -> directory: peers that fit a job
CREDIT_PROTOCOL = "/meshminer/directory/credit/1"  # any node -> directory: its credit table
TASK_PROTOCOL = "/meshminer/task/1"
BLOB_PROTOCOL = "/meshminer/blob/1"
PROGRESS_PROTOCOL = "/meshminer/progress/1"
RESULT_PROTOCOL = "/meshminer/result/1"
RECEIPT_PROTOCOL = "/meshminer/receipt/1"  # worker -> owner: the countersigned receipt
