# One customer-managed key with rotation on. The key policy keeps the account in control (IAM
# policies then decide who may use the key) and, when asked, lets CloudWatch Logs encrypt the
# named log groups: a log group with a KMS key cannot be created without that grant.

data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}
data "aws_region" "current" {}

locals {
  account_root = "arn:${data.aws_partition.current.partition}:iam::${data.aws_caller_identity.current.account_id}:root"

  account_statement = {
    Sid       = "AccountAdministersTheKey"
    Effect    = "Allow"
    Principal = { AWS = local.account_root }
    Action    = "kms:*"
    Resource  = "*"
  }

  logs_statement = {
    Sid       = "CloudWatchLogsUsesTheKey"
    Effect    = "Allow"
    Principal = { Service = "logs.${data.aws_region.current.region}.amazonaws.com" }
    Action = [
      "kms:Encrypt*",
      "kms:Decrypt*",
      "kms:ReEncrypt*",
      "kms:GenerateDataKey*",
      "kms:Describe*",
    ]
    Resource = "*"
    Condition = {
      ArnLike = { "kms:EncryptionContext:aws:logs:arn" = var.log_group_arn_patterns }
    }
  }

  statements = concat(
    [local.account_statement],
    length(var.log_group_arn_patterns) > 0 ? [local.logs_statement] : [],
  )
}

resource "aws_kms_key" "this" {
  description             = var.description
  enable_key_rotation     = true
  deletion_window_in_days = var.deletion_window_in_days
  policy = jsonencode({
    Version   = "2012-10-17"
    Statement = local.statements
  })
  tags = var.tags
}

resource "aws_kms_alias" "this" {
  name          = "alias/${var.name}"
  target_key_id = aws_kms_key.this.key_id
}
