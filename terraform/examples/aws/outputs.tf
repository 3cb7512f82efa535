# Every WAITROOM_* value the service needs. Plain values are given as they are; secrets as the
# Secrets Manager ARN that ECS injects (the task definition already wires them; these outputs are
# for running the binary elsewhere, e.g. `waitroom migrate` from an operator host).

output "waitroom_environment" {
  description = "All plain WAITROOM_* settings of the task, as ECS sets them."
  value       = module.service.environment
}

output "waitroom_secrets" {
  description = "All WAITROOM_* settings injected from Secrets Manager: name => valueFrom (ARN, or ARN:json-key:: for JSON secrets)."
  value       = module.service.secret_settings
}

output "waitroom_env" {
  description = "WAITROOM_ENV."
  value       = module.service.environment["WAITROOM_ENV"]
}

output "waitroom_http_addr" {
  description = "WAITROOM_HTTP_ADDR inside the task."
  value       = module.service.environment["WAITROOM_HTTP_ADDR"]
}

output "waitroom_url" {
  description = "WAITROOM_URL: what `waitroom healthcheck` probes inside the task."
  value       = module.service.environment["WAITROOM_URL"]
}

output "waitroom_redis_nodes" {
  description = "WAITROOM_REDIS_NODES: rediss:// URL of the ElastiCache configuration endpoint."
  value       = module.elasticache.redis_nodes
}

output "waitroom_redis_mode" {
  description = "WAITROOM_REDIS_MODE."
  value       = local.environment["WAITROOM_REDIS_MODE"]
}

output "waitroom_redis_password_secret_arn" {
  description = "WAITROOM_REDIS_PASSWORD: secret with the ElastiCache AUTH token."
  value       = module.elasticache.auth_token_secret_arn
}

output "waitroom_kafka_brokers" {
  description = "WAITROOM_KAFKA_BROKERS: MSK bootstrap servers for SASL/SCRAM over TLS (port 9096)."
  value       = module.msk.bootstrap_brokers
}

output "waitroom_kafka_topic" {
  description = "WAITROOM_KAFKA_TOPIC."
  value       = module.msk.bookings_topic
}

output "waitroom_kafka_security_protocol" {
  description = "WAITROOM_KAFKA_SECURITY_PROTOCOL."
  value       = local.kafka_security["WAITROOM_KAFKA_SECURITY_PROTOCOL"]
}

output "waitroom_kafka_sasl_mechanism" {
  description = "WAITROOM_KAFKA_SASL_MECHANISM."
  value       = local.kafka_security["WAITROOM_KAFKA_SASL_MECHANISM"]
}

output "waitroom_kafka_sasl_username" {
  description = "WAITROOM_KAFKA_SASL_USERNAME."
  value       = module.msk.sasl_username
}

output "waitroom_kafka_sasl_password_secret_arn" {
  description = "WAITROOM_KAFKA_SASL_PASSWORD: the MSK SCRAM secret (JSON key password)."
  value       = module.msk.scram_secret_arn
}

output "waitroom_database_url" {
  description = "WAITROOM_DATABASE_URL without its password (sslmode=verify-full); the full URL is in waitroom_database_url_secret_arn."
  value       = module.rds.database_url_redacted
}

output "waitroom_database_url_secret_arn" {
  description = "WAITROOM_DATABASE_URL: secret whose JSON key url holds the full URL."
  value       = module.rds.database_url_secret_arn
}

output "waitroom_admin_token_secret_arn" {
  description = "WAITROOM_ADMIN_TOKEN: secret with the admin API's bearer token."
  value       = module.service.admin_token_secret_arn
}

output "waitroom_token_secret_secret_arn" {
  description = "WAITROOM_TOKEN_SECRET: secret with the key that signs tickets and access tokens."
  value       = module.service.token_secret_secret_arn
}

output "service_url" {
  description = "Public URL of the service."
  value       = module.service.url
}

output "alb_dns_name" {
  description = "Point the certificate's DNS name here (CNAME or Route 53 alias)."
  value       = module.service.alb_dns_name
}

output "ecs_cluster" {
  description = "ECS cluster of the service."
  value       = module.service.cluster_name
}

output "ecs_service" {
  description = "ECS service name."
  value       = module.service.service_name
}

output "task_definition_arn" {
  description = "Task definition, for one-off tasks (migrate, reconcile)."
  value       = module.service.task_definition_arn
}

output "bookings_topic_create_command" {
  description = "Creates the bookings topic with the chosen partitions and replication (docs/deploy.md)."
  value       = module.msk.topic_create_command
}

output "database_master_secret_arn" {
  description = "RDS-managed master user secret, for the one-time role set-up (docs/deploy.md)."
  value       = module.rds.master_user_secret_arn
}

output "database_address" {
  description = "RDS host name."
  value       = module.rds.address
}

output "redis_replication_group_id" {
  description = "ElastiCache replication group (for resharding and failover commands)."
  value       = module.elasticache.replication_group_id
}

output "redis_alarm_names" {
  description = "CloudWatch alarms on the cache nodes."
  value       = module.elasticache.alarm_names
}
