variable "name" {
  description = "Replication group id (lowercase, at most 40 characters); also the prefix of the other resources."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,39}$", var.name))
    error_message = "name must start with a letter and hold at most 40 lowercase letters, digits or hyphens."
  }
}

variable "engine" {
  description = "valkey or redis."
  type        = string
  default     = "valkey"

  validation {
    condition     = contains(["valkey", "redis"], var.engine)
    error_message = "engine must be valkey or redis."
  }
}

variable "engine_version" {
  description = "Engine version (valkey 8.x or redis 7.x; the service needs scripts, hash tags and CLUSTER SLOTS, nothing newer)."
  type        = string
  default     = "8.0"
}

variable "parameter_group_family" {
  description = "Parameter group family matching engine_version: valkey8 or redis7."
  type        = string
  default     = "valkey8"

  validation {
    condition     = contains(["valkey8", "redis7"], var.parameter_group_family)
    error_message = "parameter_group_family must be valkey8 or redis7."
  }
}

variable "node_type" {
  description = "Node type of every primary and replica. Size it with docs/deploy.md (memory per waiting user, engine CPU per request)."
  type        = string
  default     = "cache.r7g.large"
}

variable "num_node_groups" {
  description = "Shards (node groups, one primary each). Changing it on a live group reshards online; see docs/deploy.md."
  type        = number
  default     = 3

  validation {
    condition     = var.num_node_groups >= 1 && var.num_node_groups <= 500
    error_message = "num_node_groups must be between 1 and 500."
  }
}

variable "replicas_per_node_group" {
  description = "Replicas per shard. At least 1: automatic failover and Multi-AZ need a replica to promote."
  type        = number
  default     = 1

  validation {
    condition     = var.replicas_per_node_group >= 1 && var.replicas_per_node_group <= 5
    error_message = "replicas_per_node_group must be between 1 and 5 (0 would leave no failover target)."
  }
}

variable "port" {
  description = "Port the nodes listen on."
  type        = number
  default     = 6379
}

variable "subnet_ids" {
  description = "Private subnets in at least two availability zones (Multi-AZ places each replica away from its primary)."
  type        = list(string)
}

variable "security_group_ids" {
  description = "Security groups of the nodes (modules/security_groups: only the service may connect)."
  type        = list(string)
}

variable "auth_token_update_strategy" {
  description = "How a new AUTH token is applied: ROTATE keeps the old one valid too (while tasks move to the new secret), SET then drops the old one (docs/deploy.md)."
  type        = string
  default     = "ROTATE"

  validation {
    condition     = contains(["ROTATE", "SET"], var.auth_token_update_strategy)
    error_message = "auth_token_update_strategy must be ROTATE or SET."
  }
}

variable "maintenance_window" {
  description = "Weekly maintenance window, UTC (ddd:hh24:mi-ddd:hh24:mi). Keep it away from sale times."
  type        = string
  default     = "tue:18:00-tue:19:00"
}

variable "snapshot_window" {
  description = "Daily snapshot window, UTC (hh24:mi-hh24:mi); must not overlap the maintenance window."
  type        = string
  default     = "16:00-17:00"
}

variable "snapshot_retention_limit" {
  description = "Days of automatic snapshots kept. The line is short-lived; snapshots help after an operator mistake, not a node loss (replicas cover that)."
  type        = number
  default     = 3
}

variable "apply_immediately" {
  description = "Apply modifications now instead of in the maintenance window. Resharding (num_node_groups) always runs at once."
  type        = bool
  default     = false
}

variable "log_retention_days" {
  description = "Retention of the slow-log and engine-log groups."
  type        = number
  default     = 365
}

variable "alarm_actions" {
  description = "SNS topic ARNs notified when an alarm fires or clears."
  type        = list(string)
  default     = []
}

variable "engine_cpu_alarm_percent" {
  description = "EngineCPUUtilization (the engine thread's share of one core: the node's command capacity in use) above which a node alarms. The operators scale up at 70 %."
  type        = number
  default     = 70
}

variable "memory_alarm_percent" {
  description = "DatabaseMemoryUsagePercentage (used memory over maxmemory) above which a node alarms. With noeviction, writes fail at 100 %."
  type        = number
  default     = 80
}

variable "connections_alarm_count" {
  description = "CurrConnections per node above which a node alarms (the operators check connection use above 200)."
  type        = number
  default     = 200
}

variable "replication_lag_alarm_seconds" {
  description = "ReplicationLag (seconds) above which a replica alarms."
  type        = number
  default     = 1
}

variable "node_ops_capacity" {
  description = "Commands per second one node of node_type sustains for waitroom's command mix, measured (docs/deploy.md). When above 0, a node also alarms at 70 % of it; 0 leaves the ops alarm out and EngineCPUUtilization stands for it."
  type        = number
  default     = 0
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)
  default     = {}
}
