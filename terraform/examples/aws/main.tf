# One deployment of waitroom on AWS: security groups, then ElastiCache (cluster mode), MSK and
# RDS, then the service that connects to all three over TLS. `terraform apply` creates them in
# dependency order; docs/deploy.md gives the steps around it (image, topic, database role, first
# event).

locals {
  data_subnet_ids = length(var.data_subnet_ids) > 0 ? var.data_subnet_ids : var.private_subnet_ids

  # Settings for TLS and credentials to the data stores. WAITROOM_REDIS_NODES,
  # WAITROOM_KAFKA_BROKERS and WAITROOM_DATABASE_URL are read by the service today; the names
  # of the TLS credentials follow issue 14 (docs/deploy.md lists which the binary reads).
  kafka_security = {
    WAITROOM_KAFKA_SECURITY_PROTOCOL = "SASL_SSL"
    WAITROOM_KAFKA_SASL_MECHANISM    = "SCRAM-SHA-512"
    WAITROOM_KAFKA_SASL_USERNAME     = module.msk.sasl_username
  }

  environment = merge(
    local.kafka_security,
    {
      WAITROOM_REDIS_NODES   = module.elasticache.redis_nodes
      WAITROOM_REDIS_MODE    = "cluster"
      WAITROOM_KAFKA_BROKERS = module.msk.bootstrap_brokers
      WAITROOM_KAFKA_TOPIC   = module.msk.bookings_topic
    },
    # A measured node capacity also draws the service's own 70 % line (dashboards, alerts).
    var.redis_node_ops_capacity > 0 ? { WAITROOM_REDIS_NODE_OPS_CAPACITY = tostring(var.redis_node_ops_capacity) } : {},
  )

  secrets = {
    WAITROOM_REDIS_PASSWORD      = { secret_arn = module.elasticache.auth_token_secret_arn, json_key = null }
    WAITROOM_KAFKA_SASL_PASSWORD = { secret_arn = module.msk.scram_secret_arn, json_key = "password" }
    WAITROOM_DATABASE_URL        = { secret_arn = module.rds.database_url_secret_arn, json_key = "url" }
  }
}

module "security_groups" {
  source = "../../modules/security_groups"

  name                        = var.name
  vpc_id                      = var.vpc_id
  operator_security_group_ids = var.operator_security_group_ids
}

module "elasticache" {
  source = "../../modules/elasticache"

  name                       = "${var.name}-line"
  node_type                  = var.redis_node_type
  num_node_groups            = var.redis_num_node_groups
  replicas_per_node_group    = var.redis_replicas_per_node_group
  node_ops_capacity          = var.redis_node_ops_capacity
  auth_token_update_strategy = var.redis_auth_token_update_strategy
  subnet_ids                 = local.data_subnet_ids
  security_group_ids         = [module.security_groups.redis_security_group_id]
  alarm_actions              = var.alarm_sns_topic_arns
}

module "msk" {
  source = "../../modules/msk"

  name                              = "${var.name}-bookings"
  instance_type                     = var.msk_instance_type
  broker_count                      = var.msk_broker_count
  bookings_topic_partitions         = var.bookings_topic_partitions
  bookings_topic_replication_factor = var.bookings_topic_replication_factor
  subnet_ids                        = local.data_subnet_ids
  security_group_ids                = [module.security_groups.kafka_security_group_id]
}

module "rds" {
  source = "../../modules/rds"

  name               = "${var.name}-ledger"
  instance_class     = var.rds_instance_class
  subnet_ids         = local.data_subnet_ids
  security_group_ids = [module.security_groups.postgres_security_group_id]
}

module "service" {
  source = "../../modules/service"

  name                       = var.name
  vpc_id                     = var.vpc_id
  public_subnet_ids          = var.public_subnet_ids
  private_subnet_ids         = var.private_subnet_ids
  alb_security_group_id      = module.security_groups.alb_security_group_id
  service_security_group_id  = module.security_groups.service_security_group_id
  certificate_arn            = var.certificate_arn
  alb_access_logs_bucket     = var.alb_access_logs_bucket
  alb_minimum_capacity_units = var.alb_minimum_capacity_units
  waf_web_acl_arn            = var.waf_web_acl_arn
  image                      = var.image
  task_cpu                   = var.service_task_cpu
  task_memory                = var.service_task_memory
  min_count                  = var.service_min_count
  max_count                  = var.service_max_count

  environment = local.environment
  secrets     = local.secrets
  secret_kms_key_arns = [
    module.elasticache.kms_key_arn,
    module.msk.kms_key_arn,
    module.rds.kms_key_arn,
  ]
}
