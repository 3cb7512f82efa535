output "bootstrap_brokers" {
  description = "WAITROOM_KAFKA_BROKERS: the SASL/SCRAM-over-TLS bootstrap servers (port 9096)."
  value       = aws_msk_cluster.this.bootstrap_brokers_sasl_scram
}

output "scram_secret_arn" {
  description = "Secret with the SCRAM username and password (JSON keys username and password)."
  value       = aws_secretsmanager_secret.scram.arn
}

output "sasl_username" {
  description = "WAITROOM_KAFKA_SASL_USERNAME."
  value       = var.sasl_username
}

output "kms_key_arn" {
  description = "KMS key of the SCRAM secret (the service's execution role needs kms:Decrypt on it)."
  value       = module.kms.key_arn
}

output "cluster_arn" {
  description = "ARN of the MSK cluster."
  value       = aws_msk_cluster.this.arn
}

output "bookings_topic" {
  description = "WAITROOM_KAFKA_TOPIC."
  value       = var.bookings_topic
}

output "topic_create_command" {
  description = "Creates the bookings topic with the chosen partitions and replication (run from a host allowed on the Kafka port, with a client.properties for SASL_SSL / SCRAM-SHA-512; docs/deploy.md)."
  value       = "kafka-topics.sh --bootstrap-server ${aws_msk_cluster.this.bootstrap_brokers_sasl_scram} --command-config client.properties --create --if-not-exists --topic ${var.bookings_topic} --partitions ${var.bookings_topic_partitions} --replication-factor ${var.bookings_topic_replication_factor} --config min.insync.replicas=${var.min_insync_replicas}"
}
