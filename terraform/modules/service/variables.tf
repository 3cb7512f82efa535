variable "name" {
  description = "Name of the ECS cluster, service, load balancer and the other resources (at most 28 characters: target group names are limited)."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,27}$", var.name))
    error_message = "name must start with a letter and hold at most 28 lowercase letters, digits or hyphens."
  }
}

variable "vpc_id" {
  description = "VPC of the load balancer and the tasks."
  type        = string
}

variable "public_subnet_ids" {
  description = "Subnets of the internet-facing load balancer (two or more zones)."
  type        = list(string)
}

variable "private_subnet_ids" {
  description = "Subnets of the tasks: no public IPs; they reach AWS APIs through NAT or VPC endpoints."
  type        = list(string)
}

variable "alb_security_group_id" {
  description = "Security group of the load balancer (modules/security_groups)."
  type        = string
}

variable "service_security_group_id" {
  description = "Security group of the tasks (modules/security_groups): the only one the data stores accept."
  type        = string
}

variable "certificate_arn" {
  description = "ACM certificate of the HTTPS listener."
  type        = string
}

variable "ssl_policy" {
  description = "TLS policy of the HTTPS listener (TLS 1.2 and 1.3 only)."
  type        = string
  default     = "ELBSecurityPolicy-TLS13-1-2-2021-06"
}

variable "alb_idle_timeout" {
  description = "Seconds an idle client connection is kept. Waiting clients poll every 0.8-12 s (next_poll_ms, docs/api.md), so 30 s keeps one connection per client between polls instead of a TLS handshake per poll."
  type        = number
  default     = 30
}

variable "alb_access_logs_bucket" {
  description = "Existing S3 bucket for the load balancer's access logs (its policy must let Elastic Load Balancing write)."
  type        = string
}

variable "alb_access_logs_prefix" {
  description = "Key prefix of the access logs in the bucket."
  type        = string
  default     = "waitroom-alb"
}

variable "alb_minimum_capacity_units" {
  description = "Load balancer capacity reserved ahead of a sale (LCUs); null reserves none. A sale's first second arrives faster than the load balancer scales on its own."
  type        = number
  default     = null
}

variable "alb_deletion_protection" {
  description = "Refuse to delete the load balancer."
  type        = bool
  default     = true
}

variable "waf_web_acl_arn" {
  description = "WAFv2 web ACL to associate with the load balancer; null associates none."
  type        = string
  default     = null
}

variable "image" {
  description = "Container image of the service (the repository's Dockerfile), by digest or immutable tag."
  type        = string
}

variable "container_port" {
  description = "Port the service listens on inside the task (WAITROOM_HTTP_ADDR)."
  type        = number
  default     = 8080
}

variable "container_user" {
  description = "uid:gid the container runs as; the image's waitroom user."
  type        = string
  default     = "10001:10001"
}

variable "cpu_architecture" {
  description = "X86_64 or ARM64: the architecture the image was built for."
  type        = string
  default     = "X86_64"
}

variable "task_cpu" {
  description = "CPU units per task (1024 = 1 vCPU)."
  type        = number
  default     = 2048
}

variable "task_memory" {
  description = "MiB of memory per task."
  type        = number
  default     = 4096
}

variable "desired_count" {
  description = "Tasks at creation; afterwards autoscaling owns the count."
  type        = number
  default     = 2
}

variable "min_count" {
  description = "Autoscaling floor. Raise it before a sale opens (docs/deploy.md): scaling reacts in minutes, a sale in a second."
  type        = number
  default     = 2
}

variable "max_count" {
  description = "Autoscaling ceiling. Each task holds connections to every cache node; keep max_count under the per-node connections alarm."
  type        = number
  default     = 40
}

variable "cpu_target_percent" {
  description = "Target average CPU of the tasks."
  type        = number
  default     = 60
}

variable "requests_per_target_per_minute" {
  description = "Target ALB requests per task per minute (ALBRequestCountPerTarget): 10,000/s, about 40 % of what the measured service CPU per request allows a 2-vCPU task at the 60 % CPU target (docs/deploy.md, sizing)."
  type        = number
  default     = 600000
}

variable "stop_timeout" {
  description = "Seconds ECS waits after SIGTERM before killing the container: longer than WAITROOM_DRAIN_SECONDS plus an admission tick."
  type        = number
  default     = 30
}

variable "deregistration_delay" {
  description = "Seconds the load balancer lets in-flight requests finish on a deregistered task."
  type        = number
  default     = 20
}

variable "sticky_polls" {
  description = "Send a client's requests back to the task that took its first one (an lb_cookie): its polls reach the task that remembers its place. Off, every task learns every ticket it is sent with a read on the event's primary."
  type        = bool
  default     = true
}

variable "sticky_seconds" {
  description = "How long a client stays with its task (the lb_cookie's lifetime, 1 to 604800 s): longer than a sale's line lasts."
  type        = number
  default     = 14400

  validation {
    condition     = var.sticky_seconds >= 1 && var.sticky_seconds <= 604800
    error_message = "sticky_seconds must be 1 to 604800 (the load balancer's bounds)."
  }
}

variable "environment" {
  description = "Plain WAITROOM_* settings (name => value). WAITROOM_ENV, WAITROOM_HTTP_ADDR and WAITROOM_URL are set by the module."
  type        = map(string)
  default     = {}
}

variable "secrets" {
  description = "Settings injected from Secrets Manager (name => secret ARN and, for a JSON secret, the key). WAITROOM_ADMIN_TOKEN and WAITROOM_TOKEN_SECRET are created by the module."
  type = map(object({
    secret_arn = string
    json_key   = optional(string)
  }))
  default = {}
}

variable "secret_kms_key_arns" {
  description = "KMS keys of the secrets in var.secrets (the execution role may decrypt with them)."
  type        = list(string)
  default     = []
}

variable "log_retention_days" {
  description = "Retention of the service's log group."
  type        = number
  default     = 365
}

variable "rust_log" {
  description = "RUST_LOG of the service."
  type        = string
  default     = "info"
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)
  default     = {}
}
