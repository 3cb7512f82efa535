variable "name" {
  description = "DB instance identifier; also the prefix of the other resources."
  type        = string
}

variable "engine_version" {
  description = "PostgreSQL major (or major.minor) version."
  type        = string
  default     = "16"
}

variable "parameter_group_family" {
  description = "Parameter group family matching engine_version."
  type        = string
  default     = "postgres16"
}

variable "instance_class" {
  description = "Instance class. The ledger's write rate, not the line, sizes it (docs/deploy.md)."
  type        = string
  default     = "db.r7g.large"
}

variable "allocated_storage" {
  description = "Initial GiB of gp3 storage."
  type        = number
  default     = 100
}

variable "max_allocated_storage" {
  description = "Storage autoscaling ceiling, GiB."
  type        = number
  default     = 1000
}

variable "db_name" {
  description = "Database created with the instance."
  type        = string
  default     = "waitroom"
}

variable "master_username" {
  description = "Master user. Its password is managed by RDS in Secrets Manager; the service does not use it."
  type        = string
  default     = "waitroom_admin"
}

variable "app_username" {
  description = "Login role of the service, created once by an operator (docs/deploy.md) with the password from the database URL secret."
  type        = string
  default     = "waitroom"
}

variable "subnet_ids" {
  description = "Private subnets in at least two availability zones."
  type        = list(string)
}

variable "security_group_ids" {
  description = "Security groups of the instance (modules/security_groups: only the service may connect)."
  type        = list(string)
}

variable "backup_retention_period" {
  description = "Days of automated backups (point-in-time recovery window)."
  type        = number
  default     = 14
}

variable "backup_window" {
  description = "Daily backup window, UTC (hh24:mi-hh24:mi)."
  type        = string
  default     = "17:00-18:00"
}

variable "maintenance_window" {
  description = "Weekly maintenance window, UTC. Keep it away from sale times."
  type        = string
  default     = "tue:19:00-tue:20:00"
}

variable "deletion_protection" {
  description = "Refuse to delete the instance (turn off deliberately before a destroy)."
  type        = bool
  default     = true
}

variable "iam_database_authentication_enabled" {
  description = "Allow IAM authentication for operators. The service itself logs in with the password in the database URL."
  type        = bool
  default     = true
}

variable "performance_insights_retention_period" {
  description = "Days of Performance Insights data (7 is the free tier)."
  type        = number
  default     = 7
}

variable "monitoring_interval" {
  description = "Enhanced Monitoring interval, seconds (0 turns it off)."
  type        = number
  default     = 30
}

variable "ca_cert_identifier" {
  description = "Certificate authority of the server certificate; the image trusts the RDS global bundle, which covers it."
  type        = string
  default     = "rds-ca-rsa2048-g1"
}

variable "sslrootcert_path" {
  description = "Path of the RDS CA bundle inside the service image (the Dockerfile puts it there)."
  type        = string
  default     = "/etc/ssl/certs/rds-global-bundle.pem"
}

variable "slow_statement_ms" {
  description = "log_min_duration_statement: statements slower than this are logged."
  type        = number
  default     = 500
}

variable "log_retention_days" {
  description = "Retention of the exported PostgreSQL logs."
  type        = number
  default     = 365
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)
  default     = {}
}
