output "address" {
  description = "Host name of the instance (the name the server certificate carries)."
  value       = aws_db_instance.this.address
}

output "port" {
  description = "Port of the instance."
  value       = aws_db_instance.this.port
}

output "database_url_secret_arn" {
  description = "Secret whose JSON key url is WAITROOM_DATABASE_URL (postgres://, sslmode=verify-full)."
  value       = aws_secretsmanager_secret.app.arn
}

output "database_url_redacted" {
  description = "WAITROOM_DATABASE_URL with the password left out: what the secret holds."
  value       = "postgres://${var.app_username}:***@${aws_db_instance.this.address}:${aws_db_instance.this.port}/${var.db_name}?sslmode=verify-full&sslrootcert=${var.sslrootcert_path}"
}

output "master_user_secret_arn" {
  description = "RDS-managed secret of the master user (for the one-time role set-up only)."
  value       = aws_db_instance.this.master_user_secret[0].secret_arn
}

output "app_username" {
  description = "The service's login role."
  value       = var.app_username
}

output "db_name" {
  description = "Database of the ledger."
  value       = var.db_name
}

output "kms_key_arn" {
  description = "KMS key of the storage and the database secret (the service's execution role needs kms:Decrypt on it)."
  value       = module.kms.key_arn
}
