# ElastiCache (Valkey or Redis OSS) in cluster mode for the waiting line: num_node_groups
# shards of one primary and replicas_per_node_group replicas each, spread over availability
# zones, with automatic failover, TLS required in transit, KMS at rest, and an AUTH token that
# lives in Secrets Manager. The service connects to the configuration endpoint over rediss://
# and learns the shards from CLUSTER SLOTS; MOVED/ASK during resharding and failover are
# followed by the redis-rs cluster client.

data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}
data "aws_region" "current" {}

locals {
  log_group_prefix = "/aws/elasticache/${var.name}"
  log_types        = toset(["slow-log", "engine-log"])
}

module "kms" {
  source = "../kms"

  name        = "${var.name}-elasticache"
  description = "waitroom ${var.name}: ElastiCache data at rest, its AUTH token secret and its logs"
  log_group_arn_patterns = [
    "arn:${data.aws_partition.current.partition}:logs:${data.aws_region.current.region}:${data.aws_caller_identity.current.account_id}:log-group:${local.log_group_prefix}/*",
  ]
  tags = var.tags
}

# The AUTH token: letters and digits only, so it needs no escaping in a URL or a shell.
resource "random_password" "auth_token" {
  length  = 64
  special = false
}

resource "aws_secretsmanager_secret" "auth_token" {
  #checkov:skip=CKV2_AWS_57: the AUTH token is rotated from Terraform in two applies (auth_token_update_strategy ROTATE, then SET; docs/deploy.md), which a rotation Lambda cannot do
  name                    = "${var.name}/redis-auth-token"
  description             = "AUTH token of ElastiCache replication group ${var.name} (WAITROOM_REDIS_PASSWORD)"
  kms_key_id              = module.kms.key_arn
  recovery_window_in_days = 7
  tags                    = var.tags
}

resource "aws_secretsmanager_secret_version" "auth_token" {
  secret_id     = aws_secretsmanager_secret.auth_token.id
  secret_string = random_password.auth_token.result
}

resource "aws_elasticache_parameter_group" "this" {
  name        = "${var.name}-cluster"
  family      = var.parameter_group_family
  description = "waitroom ${var.name}: cluster mode, never evict a waiting user"

  # Cluster mode: the line is spread over shards by hash tag (docs/architecture.md).
  parameter {
    name  = "cluster-enabled"
    value = "yes"
  }

  # A full node must refuse writes (the service answers 503) rather than silently drop
  # somebody's place in line.
  parameter {
    name  = "maxmemory-policy"
    value = "noeviction"
  }

  tags = var.tags

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_elasticache_subnet_group" "this" {
  name        = "${var.name}-subnets"
  description = "waitroom ${var.name}: private subnets of the cache nodes"
  subnet_ids  = var.subnet_ids
  tags        = var.tags
}

resource "aws_cloudwatch_log_group" "this" {
  for_each = local.log_types

  name              = "${local.log_group_prefix}/${each.key}"
  retention_in_days = var.log_retention_days
  kms_key_id        = module.kms.key_arn
  tags              = var.tags
}

resource "aws_elasticache_replication_group" "this" {
  replication_group_id = var.name
  description          = "waitroom ${var.name}: the waiting line (cluster mode)"

  engine               = var.engine
  engine_version       = var.engine_version
  node_type            = var.node_type
  port                 = var.port
  parameter_group_name = aws_elasticache_parameter_group.this.name

  # Cluster mode on: shards and replicas per shard are the two sizing knobs.
  cluster_mode            = "enabled"
  num_node_groups         = var.num_node_groups
  replicas_per_node_group = var.replicas_per_node_group

  # A replica in another zone takes over when a primary or its zone fails.
  automatic_failover_enabled = true
  multi_az_enabled           = true

  subnet_group_name  = aws_elasticache_subnet_group.this.name
  security_group_ids = var.security_group_ids

  # TLS required on every connection, AUTH token from Secrets Manager, KMS at rest.
  transit_encryption_enabled = true
  transit_encryption_mode    = "required"
  auth_token                 = aws_secretsmanager_secret_version.auth_token.secret_string
  auth_token_update_strategy = var.auth_token_update_strategy
  at_rest_encryption_enabled = true
  kms_key_id                 = module.kms.key_arn

  maintenance_window         = var.maintenance_window
  snapshot_window            = var.snapshot_window
  snapshot_retention_limit   = var.snapshot_retention_limit
  auto_minor_version_upgrade = true
  apply_immediately          = var.apply_immediately

  dynamic "log_delivery_configuration" {
    for_each = local.log_types
    content {
      destination      = aws_cloudwatch_log_group.this[log_delivery_configuration.value].name
      destination_type = "cloudwatch-logs"
      log_format       = "json"
      log_type         = log_delivery_configuration.value
    }
  }

  tags = var.tags
}
