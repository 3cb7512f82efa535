# RDS PostgreSQL for the ledger: Multi-AZ, storage encrypted with KMS, TLS enforced by the
# parameter group (rds.force_ssl = 1), automated backups, deletion protection, Performance
# Insights and Enhanced Monitoring. The master password is managed by RDS in Secrets Manager;
# the service logs in as its own role with a URL that demands sslmode=verify-full.

data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}
data "aws_region" "current" {}

locals {
  log_group_prefix = "/aws/rds/instance/${var.name}"
  log_exports      = toset(["postgresql", "upgrade"])
}

module "kms" {
  source = "../kms"

  name        = "${var.name}-rds"
  description = "waitroom ${var.name}: RDS storage, Performance Insights, secrets and logs"
  log_group_arn_patterns = [
    "arn:${data.aws_partition.current.partition}:logs:${data.aws_region.current.region}:${data.aws_caller_identity.current.account_id}:log-group:${local.log_group_prefix}/*",
  ]
  tags = var.tags
}

resource "aws_db_subnet_group" "this" {
  name        = "${var.name}-subnets"
  description = "waitroom ${var.name}: private subnets of the database"
  subnet_ids  = var.subnet_ids
  tags        = var.tags
}

resource "aws_db_parameter_group" "this" {
  name        = "${var.name}-pg"
  family      = var.parameter_group_family
  description = "waitroom ${var.name}: TLS only, slow statements logged"

  # Refuse every connection that is not TLS.
  parameter {
    name  = "rds.force_ssl"
    value = "1"
  }

  parameter {
    name  = "log_min_duration_statement"
    value = tostring(var.slow_statement_ms)
  }

  parameter {
    name  = "log_statement"
    value = "ddl"
  }

  parameter {
    name  = "log_connections"
    value = "1"
  }

  tags = var.tags

  lifecycle {
    create_before_destroy = true
  }
}

# Exported logs land here; creating the groups first gives them a key and a retention.
resource "aws_cloudwatch_log_group" "this" {
  for_each = local.log_exports

  name              = "${local.log_group_prefix}/${each.key}"
  retention_in_days = var.log_retention_days
  kms_key_id        = module.kms.key_arn
  tags              = var.tags
}

data "aws_iam_policy_document" "monitoring_assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["monitoring.rds.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "monitoring" {
  name               = "${var.name}-rds-monitoring"
  assume_role_policy = data.aws_iam_policy_document.monitoring_assume.json
  tags               = var.tags
}

resource "aws_iam_role_policy_attachment" "monitoring" {
  role       = aws_iam_role.monitoring.name
  policy_arn = "arn:${data.aws_partition.current.partition}:iam::aws:policy/service-role/AmazonRDSEnhancedMonitoringRole"
}

resource "aws_db_instance" "this" {
  identifier     = var.name
  engine         = "postgres"
  engine_version = var.engine_version
  instance_class = var.instance_class
  db_name        = var.db_name

  username                      = var.master_username
  manage_master_user_password   = true
  master_user_secret_kms_key_id = module.kms.key_arn

  allocated_storage     = var.allocated_storage
  max_allocated_storage = var.max_allocated_storage
  storage_type          = "gp3"
  storage_encrypted     = true
  kms_key_id            = module.kms.key_arn

  multi_az               = true
  db_subnet_group_name   = aws_db_subnet_group.this.name
  vpc_security_group_ids = var.security_group_ids
  publicly_accessible    = false
  parameter_group_name   = aws_db_parameter_group.this.name
  ca_cert_identifier     = var.ca_cert_identifier

  iam_database_authentication_enabled = var.iam_database_authentication_enabled

  backup_retention_period    = var.backup_retention_period
  backup_window              = var.backup_window
  maintenance_window         = var.maintenance_window
  copy_tags_to_snapshot      = true
  deletion_protection        = var.deletion_protection
  skip_final_snapshot        = false
  final_snapshot_identifier  = "${var.name}-final"
  auto_minor_version_upgrade = true

  performance_insights_enabled          = true
  performance_insights_kms_key_id       = module.kms.key_arn
  performance_insights_retention_period = var.performance_insights_retention_period
  monitoring_interval                   = var.monitoring_interval
  monitoring_role_arn                   = aws_iam_role.monitoring.arn
  enabled_cloudwatch_logs_exports       = sort(tolist(local.log_exports))

  tags = var.tags

  depends_on = [aws_cloudwatch_log_group.this, aws_iam_role_policy_attachment.monitoring]
}

# The service's login: letters and digits only, so the URL needs no escaping.
resource "random_password" "app" {
  length  = 40
  special = false
}

resource "aws_secretsmanager_secret" "app" {
  #checkov:skip=CKV2_AWS_57: this URL and the role's password change together (ALTER ROLE, then roll the service; docs/deploy.md); a rotation Lambda would change only one of them
  name                    = "${var.name}/database"
  description             = "waitroom ${var.name}: the service's PostgreSQL login; key url is WAITROOM_DATABASE_URL"
  kms_key_id              = module.kms.key_arn
  recovery_window_in_days = 7
  tags                    = var.tags
}

resource "aws_secretsmanager_secret_version" "app" {
  secret_id = aws_secretsmanager_secret.app.id
  secret_string = jsonencode({
    username = var.app_username
    password = random_password.app.result
    host     = aws_db_instance.this.address
    port     = aws_db_instance.this.port
    dbname   = var.db_name
    url      = "postgres://${var.app_username}:${random_password.app.result}@${aws_db_instance.this.address}:${aws_db_instance.this.port}/${var.db_name}?sslmode=verify-full&sslrootcert=${var.sslrootcert_path}"
  })
}
