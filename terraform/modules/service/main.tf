# The waitroom service on ECS Fargate: one container from the repository's Dockerfile, running as
# a non-root user on a read-only root filesystem, its settings as plain environment plus secrets
# that ECS reads from Secrets Manager at start (never in the task definition), logs in a
# KMS-encrypted log group. The load balancer and autoscaling are in alb.tf and autoscaling.tf.

data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}
data "aws_region" "current" {}

# The load balancer's nodes live in the VPC: their X-Forwarded-For is believed, nobody else's.
data "aws_vpc" "this" {
  id = var.vpc_id
}

locals {
  container_name = "waitroom"
  log_group_name = "/ecs/${var.name}"

  # Settings the module owns: production mode, listen on all interfaces of the task, the
  # address `waitroom healthcheck` probes from inside the container, and the load balancer as
  # the one trusted proxy (per-client limits then key on the buyer's address, not the ALB's).
  environment = merge(var.environment, {
    RUST_LOG                 = var.rust_log
    WAITROOM_ENV             = "production"
    WAITROOM_HTTP_ADDR       = "0.0.0.0:${var.container_port}"
    WAITROOM_URL             = "http://127.0.0.1:${var.container_port}"
    WAITROOM_TRUSTED_PROXIES = join(",", data.aws_vpc.this.cidr_block_associations[*].cidr_block)
  })

  secrets = merge(var.secrets, {
    for setting, secret in aws_secretsmanager_secret.generated : setting => { secret_arn = secret.arn, json_key = null }
  })

  # ECS reads one key of a JSON secret with ARN:key:: (version stage and id left empty).
  secret_refs = {
    for setting, s in local.secrets : setting => s.json_key == null ? s.secret_arn : "${s.secret_arn}:${s.json_key}::"
  }

  generated_secrets = {
    WAITROOM_ADMIN_TOKEN  = "bearer token of the admin API"
    WAITROOM_TOKEN_SECRET = "key that signs tickets and access tokens (shared by every task)"
  }
}

module "kms" {
  source = "../kms"

  name        = "${var.name}-service"
  description = "waitroom ${var.name}: the service's log group and generated secrets"
  log_group_arn_patterns = [
    "arn:${data.aws_partition.current.partition}:logs:${data.aws_region.current.region}:${data.aws_caller_identity.current.account_id}:log-group:${local.log_group_name}*",
  ]
  tags = var.tags
}

resource "aws_cloudwatch_log_group" "service" {
  name              = local.log_group_name
  retention_in_days = var.log_retention_days
  kms_key_id        = module.kms.key_arn
  tags              = var.tags
}

# The two secrets only the service uses, 64 letters and digits each (the service requires at
# least 32 bytes in production).
resource "random_password" "generated" {
  for_each = local.generated_secrets

  length  = 64
  special = false
}

resource "aws_secretsmanager_secret" "generated" {
  #checkov:skip=CKV2_AWS_57: a new WAITROOM_TOKEN_SECRET changes every ticket (docs/architecture.md), so these are rotated between sales by replacing random_password, never on a timer
  for_each = local.generated_secrets

  name                    = "${var.name}/${lower(replace(each.key, "WAITROOM_", ""))}"
  description             = "waitroom ${var.name}: ${each.value} (${each.key})"
  kms_key_id              = module.kms.key_arn
  recovery_window_in_days = 7
  tags                    = var.tags
}

resource "aws_secretsmanager_secret_version" "generated" {
  for_each = local.generated_secrets

  secret_id     = aws_secretsmanager_secret.generated[each.key].id
  secret_string = random_password.generated[each.key].result
}

resource "aws_ecs_cluster" "this" {
  name = var.name

  setting {
    name  = "containerInsights"
    value = "enabled"
  }

  configuration {
    execute_command_configuration {
      kms_key_id = module.kms.key_arn
      logging    = "OVERRIDE"
      log_configuration {
        cloud_watch_encryption_enabled = true
        cloud_watch_log_group_name     = aws_cloudwatch_log_group.service.name
      }
    }
  }

  tags = var.tags
}

resource "aws_ecs_task_definition" "service" {
  family                   = var.name
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = var.task_cpu
  memory                   = var.task_memory
  execution_role_arn       = aws_iam_role.execution.arn
  task_role_arn            = aws_iam_role.task.arn

  runtime_platform {
    operating_system_family = "LINUX"
    cpu_architecture        = var.cpu_architecture
  }

  container_definitions = jsonencode([{
    name                   = local.container_name
    image                  = var.image
    essential              = true
    command                = ["serve"]
    user                   = var.container_user
    readonlyRootFilesystem = true
    privileged             = false
    stopTimeout            = var.stop_timeout

    portMappings = [{
      containerPort = var.container_port
      protocol      = "tcp"
    }]

    environment = [for k in sort(keys(local.environment)) : { name = k, value = local.environment[k] }]
    secrets     = [for k in sort(keys(local.secret_refs)) : { name = k, valueFrom = local.secret_refs[k] }]

    # Liveness only (/healthz): /readyz would restart every task while Redis fails over,
    # and the service already answers 503 with Retry-After during that time.
    healthCheck = {
      command     = ["CMD", "/usr/local/bin/waitroom", "healthcheck", "--url", "http://127.0.0.1:${var.container_port}"]
      interval    = 10
      timeout     = 5
      retries     = 3
      startPeriod = 30
    }

    linuxParameters = {
      initProcessEnabled = true
      capabilities       = { drop = ["ALL"] }
    }

    # One socket per polling client and per cache node: more than the default 1024.
    ulimits = [{
      name      = "nofile"
      softLimit = 65536
      hardLimit = 65536
    }]

    logConfiguration = {
      logDriver = "awslogs"
      options = {
        awslogs-group         = aws_cloudwatch_log_group.service.name
        awslogs-region        = data.aws_region.current.region
        awslogs-stream-prefix = "waitroom"
      }
    }
  }])

  tags = var.tags
}

resource "aws_ecs_service" "service" {
  name             = var.name
  cluster          = aws_ecs_cluster.this.id
  task_definition  = aws_ecs_task_definition.service.arn
  desired_count    = var.desired_count
  launch_type      = "FARGATE"
  platform_version = "LATEST"
  propagate_tags   = "SERVICE"

  enable_execute_command            = false
  health_check_grace_period_seconds = 30

  network_configuration {
    subnets          = var.private_subnet_ids
    security_groups  = [var.service_security_group_id]
    assign_public_ip = false
  }

  load_balancer {
    target_group_arn = aws_lb_target_group.service.arn
    container_name   = local.container_name
    container_port   = var.container_port
  }

  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }

  deployment_minimum_healthy_percent = 100
  deployment_maximum_percent         = 200

  tags = var.tags

  # Autoscaling owns the task count after creation.
  lifecycle {
    ignore_changes = [desired_count]
  }

  depends_on = [aws_lb_listener.https]
}
