"""Model inspection over gRPC (InspectionService): attention maps per layer and head, with statistics."""
