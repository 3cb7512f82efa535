variable "region" {
  description = "AWS region."
  type        = string
}

variable "name" {
  description = "Name of this deployment: prefix of every resource (lowercase, at most 20 characters)."
  type        = string
  default     = "waitroom"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,19}$", var.name))
    error_message = "name must start with a letter and hold at most 20 lowercase letters, digits or hyphens."
  }
}

variable "vpc_id" {
  description = "Existing VPC."
  type        = string
}

variable "public_subnet_ids" {
  description = "Public subnets (two or more zones) for the load balancer."
  type        = list(string)
}

variable "private_subnet_ids" {
  description = "Private subnets (two or more zones, with NAT or VPC endpoints for AWS APIs) for the tasks."
  type        = list(string)
}

variable "data_subnet_ids" {
  description = "Private subnets for ElastiCache, MSK and RDS; MSK wants one per zone (2 or 3). Empty: private_subnet_ids."
  type        = list(string)
  default     = []
}

variable "certificate_arn" {
  description = "ACM certificate for the HTTPS listener."
  type        = string
}

variable "alb_access_logs_bucket" {
  description = "Existing S3 bucket for load balancer access logs."
  type        = string
}

variable "image" {
  description = "The service image built from the repository's Dockerfile (ECR URI with a digest or immutable tag)."
  type        = string
}

variable "alarm_sns_topic_arns" {
  description = "SNS topics notified by the cache alarms."
  type        = list(string)
  default     = []
}

variable "operator_security_group_ids" {
  description = "Security groups of operator hosts that may reach the data ports (psql, kafka-topics, redis-cli)."
  type        = list(string)
  default     = []
}

variable "waf_web_acl_arn" {
  description = "Optional WAFv2 web ACL for the load balancer."
  type        = string
  default     = null
}

variable "redis_node_type" {
  description = "ElastiCache node type (docs/deploy.md, sizing)."
  type        = string
  default     = "cache.r7g.large"
}

variable "redis_num_node_groups" {
  description = "ElastiCache shards (docs/deploy.md, sizing; raise it to reshard online)."
  type        = number
  default     = 3
}

variable "redis_replicas_per_node_group" {
  description = "Replicas per shard (at least 1)."
  type        = number
  default     = 1
}

variable "redis_auth_token_update_strategy" {
  description = "ROTATE while tasks move to a new AUTH token (old and new both valid), SET to drop the old one (docs/deploy.md, rotating secrets)."
  type        = string
  default     = "ROTATE"
}

variable "redis_node_ops_capacity" {
  description = "Measured commands per second per node: the cache ops alarm fires at 70 % of it, and the service gets it as WAITROOM_REDIS_NODE_OPS_CAPACITY. 0 leaves both out."
  type        = number
  default     = 0
}

variable "msk_instance_type" {
  description = "MSK broker instance type."
  type        = string
  default     = "kafka.m7g.large"
}

variable "msk_broker_count" {
  description = "MSK brokers (a multiple of the number of data subnets)."
  type        = number
  default     = 3
}

variable "bookings_topic_partitions" {
  description = "Partitions of the bookings topic."
  type        = number
  default     = 6
}

variable "bookings_topic_replication_factor" {
  description = "Replication factor of the bookings topic."
  type        = number
  default     = 3
}

variable "rds_instance_class" {
  description = "RDS instance class."
  type        = string
  default     = "db.r7g.large"
}

variable "service_task_cpu" {
  description = "CPU units per task."
  type        = number
  default     = 2048
}

variable "service_task_memory" {
  description = "MiB per task."
  type        = number
  default     = 4096
}

variable "service_min_count" {
  description = "Autoscaling floor of the service; raise before a sale."
  type        = number
  default     = 2
}

variable "service_max_count" {
  description = "Autoscaling ceiling of the service."
  type        = number
  default     = 40
}

variable "alb_minimum_capacity_units" {
  description = "LCUs reserved on the load balancer ahead of a sale; null reserves none."
  type        = number
  default     = null
}

variable "tags" {
  description = "Extra tags for every resource."
  type        = map(string)
  default     = {}
}
