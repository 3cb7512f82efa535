variable "name" {
  description = "Prefix of every security group name."
  type        = string
}

variable "vpc_id" {
  description = "VPC that holds the load balancer, the service and the data stores."
  type        = string
}

variable "public_ingress_cidrs" {
  description = "IPv4 ranges allowed to reach the load balancer on HTTPS (443). The only port open to the internet."
  type        = list(string)
  default     = ["0.0.0.0/0"]
}

variable "service_port" {
  description = "Container port of the service (WAITROOM_HTTP_ADDR)."
  type        = number
  default     = 8080
}

variable "redis_port" {
  description = "ElastiCache port."
  type        = number
  default     = 6379
}

variable "kafka_port" {
  description = "MSK port for SASL/SCRAM over TLS."
  type        = number
  default     = 9096
}

variable "postgres_port" {
  description = "RDS PostgreSQL port."
  type        = number
  default     = 5432
}

variable "https_egress_cidrs" {
  description = "Where the service may open HTTPS connections: AWS APIs (Secrets Manager, ECR, CloudWatch Logs) through NAT or VPC endpoints. Narrow it to the VPC range when every API has an interface endpoint."
  type        = list(string)
  default     = ["0.0.0.0/0"]
}

variable "operator_security_group_ids" {
  description = "Security groups of operator hosts (a bastion, a one-off ECS task) that may also reach the data ports, for psql, kafka-topics and redis-cli. Empty: only the service."
  type        = list(string)
  default     = []
}

variable "tags" {
  description = "Tags for every security group."
  type        = map(string)
  default     = {}
}
