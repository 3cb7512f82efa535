output "alb_security_group_id" {
  description = "Security group of the load balancer."
  value       = aws_security_group.alb.id
}

output "service_security_group_id" {
  description = "Security group of the service tasks: the only source the data stores accept."
  value       = aws_security_group.service.id
}

output "redis_security_group_id" {
  description = "Security group of the ElastiCache replication group."
  value       = aws_security_group.data["redis"].id
}

output "kafka_security_group_id" {
  description = "Security group of the MSK brokers."
  value       = aws_security_group.data["kafka"].id
}

output "postgres_security_group_id" {
  description = "Security group of the RDS instance."
  value       = aws_security_group.data["postgres"].id
}
