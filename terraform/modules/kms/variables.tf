variable "name" {
  description = "Alias suffix: the key is alias/<name>."
  type        = string
}

variable "description" {
  description = "What the key encrypts."
  type        = string
}

variable "log_group_arn_patterns" {
  description = "CloudWatch Logs log groups (ARN patterns) allowed to use the key; empty: no CloudWatch Logs grant."
  type        = list(string)
  default     = []
}

variable "deletion_window_in_days" {
  description = "Waiting period before a scheduled key deletion takes effect."
  type        = number
  default     = 30
}

variable "tags" {
  description = "Tags for the key."
  type        = map(string)
  default     = {}
}
