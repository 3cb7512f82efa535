# The internet-facing load balancer: HTTPS only (no port 80 listener, so nothing is ever served
# in clear), TLS 1.2+, invalid headers dropped, access logs kept. The target group checks
# /healthz: a task stays in rotation while a data store is down, so clients get the service's
# own 503 with Retry-After rather than the load balancer's. /readyz is for deploy smoke tests and
# dashboards (docs/deploy.md).

resource "aws_lb" "this" {
  #checkov:skip=CKV2_AWS_20: there is no HTTP listener to redirect; the load balancer listens on 443 only
  #checkov:skip=CKV2_AWS_76: WAF is optional (var.waf_web_acl_arn) and its rules are the operator's: at a sale's poll rate WAF is billed per request, and the service rate-limits each client itself
  name                       = var.name
  load_balancer_type         = "application"
  internal                   = false
  security_groups            = [var.alb_security_group_id]
  subnets                    = var.public_subnet_ids
  idle_timeout               = var.alb_idle_timeout
  drop_invalid_header_fields = true
  enable_deletion_protection = var.alb_deletion_protection

  access_logs {
    bucket  = var.alb_access_logs_bucket
    prefix  = var.alb_access_logs_prefix
    enabled = true
  }

  dynamic "minimum_load_balancer_capacity" {
    for_each = var.alb_minimum_capacity_units == null ? [] : [var.alb_minimum_capacity_units]
    content {
      capacity_units = minimum_load_balancer_capacity.value
    }
  }

  tags = var.tags
}

resource "aws_wafv2_web_acl_association" "this" {
  count = var.waf_web_acl_arn == null ? 0 : 1

  resource_arn = aws_lb.this.arn
  web_acl_arn  = var.waf_web_acl_arn
}

resource "aws_lb_target_group" "service" {
  #checkov:skip=CKV_AWS_378: TLS ends at the load balancer; tasks serve plain HTTP inside private subnets and accept only the load balancer's security group
  name                 = var.name
  port                 = var.container_port
  protocol             = "HTTP"
  target_type          = "ip"
  vpc_id               = var.vpc_id
  deregistration_delay = var.deregistration_delay

  # A client's polls go back to the task that took its enter, which remembers the ticket's place
  # and answers a poll far from the front without a Redis command. Any other task learns the
  # place once, with a read on the event's primary (the primary that takes every enter of the
  # event): with ten tasks and no stickiness, nine such reads per person (docs/deploy.md,
  # "Each task remembers the line's places"). The page's polls carry the cookie by themselves.
  stickiness {
    type            = "lb_cookie"
    enabled         = var.sticky_polls
    cookie_duration = var.sticky_seconds
  }

  health_check {
    path                = "/healthz"
    matcher             = "200"
    interval            = 10
    timeout             = 5
    healthy_threshold   = 2
    unhealthy_threshold = 3
  }

  tags = var.tags

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_lb_listener" "https" {
  load_balancer_arn = aws_lb.this.arn
  port              = 443
  protocol          = "HTTPS"
  ssl_policy        = var.ssl_policy
  certificate_arn   = var.certificate_arn

  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.service.arn
  }

  tags = var.tags
}
