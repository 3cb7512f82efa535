# MSK for the bookings topic: TLS between clients and brokers and between brokers, SASL/SCRAM
# (the credentials in a Secrets Manager secret encrypted with a customer-managed key, as MSK
# requires), KMS at rest, broker logs in CloudWatch. Topic partitions and replication are
# variables: the brokers' defaults follow them, and outputs.topic_create_command creates the
# topic with them. The service creates the topic only when it is missing, with its own defaults
# (docs/api.md), so create it first.

data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}
data "aws_region" "current" {}

locals {
  log_group_name = "/aws/msk/${var.name}"

  server_properties = {
    "auto.create.topics.enable"      = "false"
    "default.replication.factor"     = tostring(var.bookings_topic_replication_factor)
    "min.insync.replicas"            = tostring(var.min_insync_replicas)
    "num.partitions"                 = tostring(var.bookings_topic_partitions)
    "unclean.leader.election.enable" = "false"
    "allow.everyone.if.no.acl.found" = "true"
  }
}

module "kms" {
  source = "../kms"

  name        = "${var.name}-msk"
  description = "waitroom ${var.name}: MSK data at rest, the SCRAM secret and broker logs"
  log_group_arn_patterns = [
    "arn:${data.aws_partition.current.partition}:logs:${data.aws_region.current.region}:${data.aws_caller_identity.current.account_id}:log-group:${local.log_group_name}",
  ]
  tags = var.tags
}

resource "aws_cloudwatch_log_group" "brokers" {
  name              = local.log_group_name
  retention_in_days = var.log_retention_days
  kms_key_id        = module.kms.key_arn
  tags              = var.tags
}

resource "aws_msk_configuration" "this" {
  name              = "${var.name}-config"
  kafka_versions    = [var.kafka_version]
  description       = "waitroom ${var.name}: durable bookings (replication, min ISR, no unclean election)"
  server_properties = join("\n", [for k in sort(keys(local.server_properties)) : "${k} = ${local.server_properties[k]}"])

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_msk_cluster" "this" {
  cluster_name           = var.name
  kafka_version          = var.kafka_version
  number_of_broker_nodes = var.broker_count
  enhanced_monitoring    = "PER_TOPIC_PER_BROKER"

  broker_node_group_info {
    instance_type   = var.instance_type
    client_subnets  = var.subnet_ids
    security_groups = var.security_group_ids

    storage_info {
      ebs_storage_info {
        volume_size = var.ebs_volume_size
      }
    }

    connectivity_info {
      public_access {
        type = "DISABLED"
      }
    }
  }

  configuration_info {
    arn      = aws_msk_configuration.this.arn
    revision = aws_msk_configuration.this.latest_revision
  }

  # TLS only, between clients and brokers and inside the cluster; KMS at rest.
  encryption_info {
    encryption_at_rest_kms_key_arn = module.kms.key_arn
    encryption_in_transit {
      client_broker = "TLS"
      in_cluster    = true
    }
  }

  # SASL/SCRAM only (port 9096): no unauthenticated access.
  client_authentication {
    unauthenticated = false
    sasl {
      scram = true
      iam   = false
    }
  }

  logging_info {
    broker_logs {
      cloudwatch_logs {
        enabled   = true
        log_group = aws_cloudwatch_log_group.brokers.name
      }
    }
  }

  open_monitoring {
    prometheus {
      jmx_exporter {
        enabled_in_broker = true
      }
      node_exporter {
        enabled_in_broker = true
      }
    }
  }

  tags = var.tags
}

resource "random_password" "scram" {
  length  = 48
  special = false
}

# MSK only accepts SCRAM secrets whose name starts with AmazonMSK_ and that are encrypted with a
# customer-managed key.
resource "aws_secretsmanager_secret" "scram" {
  #checkov:skip=CKV2_AWS_57: the SCRAM password is rotated between sales with the service rolled at the same time (docs/deploy.md); a timed rotation would cut off running tasks
  name                    = "AmazonMSK_${var.name}_${var.sasl_username}"
  description             = "SASL/SCRAM credentials of the waitroom service on MSK cluster ${var.name} (password: WAITROOM_KAFKA_SASL_PASSWORD)"
  kms_key_id              = module.kms.key_arn
  recovery_window_in_days = 7
  tags                    = var.tags
}

resource "aws_secretsmanager_secret_version" "scram" {
  secret_id = aws_secretsmanager_secret.scram.id
  secret_string = jsonencode({
    username = var.sasl_username
    password = random_password.scram.result
  })
}

resource "aws_msk_scram_secret_association" "this" {
  cluster_arn     = aws_msk_cluster.this.arn
  secret_arn_list = [aws_secretsmanager_secret.scram.arn]

  depends_on = [aws_secretsmanager_secret_version.scram]
}
