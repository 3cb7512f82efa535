variable "name" {
  description = "MSK cluster name; also the prefix of the other resources."
  type        = string
}

variable "kafka_version" {
  description = "Kafka version of the brokers (any MSK version with SASL/SCRAM; check `aws kafka list-kafka-versions`)."
  type        = string
  default     = "3.8.x"
}

variable "broker_count" {
  description = "Broker nodes: a multiple of the number of subnets (one availability zone each)."
  type        = number
  default     = 3
}

variable "instance_type" {
  description = "Broker instance type."
  type        = string
  default     = "kafka.m7g.large"
}

variable "ebs_volume_size" {
  description = "GiB of storage per broker."
  type        = number
  default     = 100
}

variable "subnet_ids" {
  description = "Private subnets, one per availability zone (2 or 3)."
  type        = list(string)
}

variable "security_group_ids" {
  description = "Security groups of the brokers (modules/security_groups: only the service may connect)."
  type        = list(string)
}

variable "sasl_username" {
  description = "SCRAM user the service authenticates as (WAITROOM_KAFKA_SASL_USERNAME)."
  type        = string
  default     = "waitroom"
}

variable "bookings_topic" {
  description = "The bookings topic (WAITROOM_KAFKA_TOPIC). Created by an operator before the first start (docs/deploy.md) or, failing that, by the service at start-up."
  type        = string
  default     = "waitroom.bookings"
}

variable "bookings_topic_partitions" {
  description = "Partitions of the bookings topic: the ceiling on ledger consumers working in parallel (one per partition in the consumer group). Also the brokers' num.partitions."
  type        = number
  default     = 6
}

variable "bookings_topic_replication_factor" {
  description = "Replication factor of the bookings topic; also default.replication.factor. The producer uses acks=all, so with min_insync_replicas a booking survives the loss of a broker."
  type        = number
  default     = 3

  validation {
    condition     = var.bookings_topic_replication_factor >= 2
    error_message = "bookings_topic_replication_factor must be at least 2: a 201 is a promise that the booking reaches PostgreSQL."
  }
}

variable "min_insync_replicas" {
  description = "min.insync.replicas: acknowledged writes reached at least this many replicas."
  type        = number
  default     = 2
}

variable "log_retention_days" {
  description = "Retention of the broker log group."
  type        = number
  default     = 365
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)
  default     = {}
}
