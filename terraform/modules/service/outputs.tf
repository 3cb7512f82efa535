output "url" {
  description = "Public URL of the service (point your DNS name, the certificate's, at alb_dns_name)."
  value       = "https://${aws_lb.this.dns_name}"
}

output "alb_dns_name" {
  description = "DNS name of the load balancer."
  value       = aws_lb.this.dns_name
}

output "alb_zone_id" {
  description = "Hosted zone of the load balancer (for a Route 53 alias)."
  value       = aws_lb.this.zone_id
}

output "cluster_name" {
  description = "ECS cluster."
  value       = aws_ecs_cluster.this.name
}

output "service_name" {
  description = "ECS service."
  value       = aws_ecs_service.service.name
}

output "task_definition_arn" {
  description = "Task definition (for one-off tasks such as `waitroom migrate` or `waitroom reconcile`)."
  value       = aws_ecs_task_definition.service.arn
}

output "log_group_name" {
  description = "Log group of the service."
  value       = aws_cloudwatch_log_group.service.name
}

output "admin_token_secret_arn" {
  description = "Secret holding WAITROOM_ADMIN_TOKEN."
  value       = aws_secretsmanager_secret.generated["WAITROOM_ADMIN_TOKEN"].arn
}

output "token_secret_secret_arn" {
  description = "Secret holding WAITROOM_TOKEN_SECRET."
  value       = aws_secretsmanager_secret.generated["WAITROOM_TOKEN_SECRET"].arn
}

output "environment" {
  description = "Plain settings of the container, as given to ECS."
  value       = local.environment
}

output "secret_settings" {
  description = "Settings ECS injects from Secrets Manager: name => valueFrom."
  value       = local.secret_refs
}
