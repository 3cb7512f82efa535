# Security groups for the whole deployment, in one place so the rule "only the service reaches
# the data stores" can be read (and tested) at a glance:
#
#   internet --443--> alb --service_port--> service --6379--> redis
#                                                   --9096--> kafka
#                                                   --5432--> postgres
#
# The data groups take ingress from the service group (and operator groups, if given) and never
# from an address range; they have no egress rules at all. Rules are separate resources, so the
# groups can reference each other without a cycle.

locals {
  data_stores = {
    redis    = { port = var.redis_port, what = "ElastiCache (Redis protocol over TLS)" }
    kafka    = { port = var.kafka_port, what = "MSK brokers (SASL/SCRAM over TLS)" }
    postgres = { port = var.postgres_port, what = "RDS PostgreSQL (TLS enforced)" }
  }

  data_clients = merge(
    { for store in keys(local.data_stores) : "${store}/service" => { store = store, source = aws_security_group.service.id, who = "the waitroom service" } },
    { for pair in setproduct(keys(local.data_stores), var.operator_security_group_ids) : "${pair[0]}/${pair[1]}" => { store = pair[0], source = pair[1], who = "operator group ${pair[1]}" } },
  )
}

resource "aws_security_group" "alb" {
  #checkov:skip=CKV2_AWS_5: attached by the calling root (examples/aws) to the load balancer in modules/service; this module only defines the groups and their rules
  name        = "${var.name}-alb"
  description = "waitroom load balancer: HTTPS from clients, HTTP to the service"
  vpc_id      = var.vpc_id
  tags        = merge(var.tags, { Name = "${var.name}-alb" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_security_group" "service" {
  #checkov:skip=CKV2_AWS_5: attached by the calling root (examples/aws) to the ECS service in modules/service; this module only defines the groups and their rules
  name        = "${var.name}-service"
  description = "waitroom service tasks: from the load balancer, to the data stores"
  vpc_id      = var.vpc_id
  tags        = merge(var.tags, { Name = "${var.name}-service" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_security_group" "data" {
  #checkov:skip=CKV2_AWS_5: attached by the calling root (examples/aws) to the replication group, MSK cluster or DB instance; this module only defines the groups and their rules
  for_each = local.data_stores

  name        = "${var.name}-${each.key}"
  description = "waitroom ${each.value.what}: only from the service"
  vpc_id      = var.vpc_id
  tags        = merge(var.tags, { Name = "${var.name}-${each.key}" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "alb_https" {
  for_each = toset(var.public_ingress_cidrs)

  security_group_id = aws_security_group.alb.id
  description       = "HTTPS from clients"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_ipv4         = each.value
}

resource "aws_vpc_security_group_egress_rule" "alb_to_service" {
  security_group_id            = aws_security_group.alb.id
  description                  = "HTTP to the service tasks"
  ip_protocol                  = "tcp"
  from_port                    = var.service_port
  to_port                      = var.service_port
  referenced_security_group_id = aws_security_group.service.id
}

resource "aws_vpc_security_group_ingress_rule" "service_from_alb" {
  security_group_id            = aws_security_group.service.id
  description                  = "HTTP from the load balancer"
  ip_protocol                  = "tcp"
  from_port                    = var.service_port
  to_port                      = var.service_port
  referenced_security_group_id = aws_security_group.alb.id
}

resource "aws_vpc_security_group_egress_rule" "service_to_data" {
  for_each = local.data_stores

  security_group_id            = aws_security_group.service.id
  description                  = "to ${each.value.what}"
  ip_protocol                  = "tcp"
  from_port                    = each.value.port
  to_port                      = each.value.port
  referenced_security_group_id = aws_security_group.data[each.key].id
}

resource "aws_vpc_security_group_egress_rule" "service_https" {
  for_each = toset(var.https_egress_cidrs)

  security_group_id = aws_security_group.service.id
  description       = "HTTPS to AWS APIs: Secrets Manager, ECR, CloudWatch Logs"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_ipv4         = each.value
}

resource "aws_vpc_security_group_ingress_rule" "data_from_clients" {
  for_each = local.data_clients

  security_group_id            = aws_security_group.data[each.value.store].id
  description                  = "${local.data_stores[each.value.store].what} from ${each.value.who}"
  ip_protocol                  = "tcp"
  from_port                    = local.data_stores[each.value.store].port
  to_port                      = local.data_stores[each.value.store].port
  referenced_security_group_id = each.value.source
}
