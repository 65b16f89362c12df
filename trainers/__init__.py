"""dwise_predict.trainers"""
