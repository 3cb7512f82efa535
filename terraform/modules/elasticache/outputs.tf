output "configuration_endpoint" {
  description = "Host name of the cluster's configuration endpoint (the seed for CLUSTER SLOTS)."
  value       = aws_elasticache_replication_group.this.configuration_endpoint_address
}

output "port" {
  description = "Port of every node."
  value       = var.port
}

output "redis_nodes" {
  description = "WAITROOM_REDIS_NODES: the configuration endpoint as a TLS seed URL."
  value       = "rediss://${aws_elasticache_replication_group.this.configuration_endpoint_address}:${var.port}"
}

output "auth_token_secret_arn" {
  description = "Secrets Manager secret holding the AUTH token (inject as WAITROOM_REDIS_PASSWORD)."
  value       = aws_secretsmanager_secret.auth_token.arn
}

output "kms_key_arn" {
  description = "KMS key of the data at rest and the AUTH token secret (the service's execution role needs kms:Decrypt on it)."
  value       = module.kms.key_arn
}

output "replication_group_id" {
  description = "Replication group id."
  value       = aws_elasticache_replication_group.this.id
}

output "member_clusters" {
  description = "Node ids of the group (the alarms' CacheClusterId values)."
  value       = aws_elasticache_replication_group.this.member_clusters
}

output "alarm_names" {
  description = "Names of the CloudWatch alarms on the nodes."
  value       = concat([for a in aws_cloudwatch_metric_alarm.node : a.alarm_name], [for a in aws_cloudwatch_metric_alarm.ops : a.alarm_name])
}
