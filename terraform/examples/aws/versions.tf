terraform {
  required_version = ">= 1.6"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 6.0"
    }
    random = {
      source  = "hashicorp/random"
      version = ">= 3.6"
    }
  }

  # The state holds the generated passwords: keep it in an encrypted, access-controlled
  # backend, for example
  # backend "s3" {
  #   bucket       = "my-terraform-state"
  #   key          = "waitroom/example.tfstate"
  #   region       = "eu-west-1"
  #   encrypt      = true
  #   kms_key_id   = "alias/terraform-state"
  #   use_lockfile = true
  # }
}

provider "aws" {
  region = var.region

  default_tags {
    tags = merge(var.tags, { Application = "waitroom", Deployment = var.name })
  }
}
